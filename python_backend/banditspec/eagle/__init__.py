"""The Eagle draft heads the ``eagle`` drafter runs, and their shipped weights (inference only).

* :mod:`.head`      EAGLE-1: EagleConfig, EagleHead (one decoder layer), save_head / load_head
* :mod:`.head3`     EAGLE-3: Eagle3Config, Eagle3Head, save_head3 / load_head3, head_info (the JSON beside the weights)
* ``weights/``      the shipped heads for SmolLM2-135M-Instruct (bf16 safetensors + JSON)

The drafter itself is :mod:`banditspec.drafters.eagle`. Offline training (corpus, self-distillation,
features, objectives, ``banditspec build eagle``, evaluation, upstream export) lives outside the
serving package, in ``banditspec_train.eagle`` (training/), which nothing here imports.
"""

from pathlib import Path

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
EAGLE1_WEIGHTS = WEIGHTS_DIR / "eagle-smollm2.safetensors"
EAGLE3_WEIGHTS = WEIGHTS_DIR / "eagle3-smollm2.safetensors"
