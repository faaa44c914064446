"""The Eagle draft heads the ``eagle`` drafter runs, and their shipped weights (inference only).

* :mod:`.head`      EAGLE-1: EagleConfig, EagleHead (one decoder layer), save_head / load_head
* :mod:`.head3`     EAGLE-3: Eagle3Config, Eagle3Head, save_head3 / load_head3, head_info (the JSON beside the weights)
* ``weights/``      the shipped heads for SmolLM2-135M-Instruct (bf16 safetensors + JSON)

The drafter itself is :mod:`banditspec.drafters.eagle`. Offline training (corpus, self-distillation,
features, objectives, ``banditspec build eagle``, evaluation, upstream export) lives outside the
serving package, in ``banditspec_train.eagle`` (training/), which nothing here imports.
"""

from pathlib import Path

from banditspec.errors import BanditSpecValidationError

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
EAGLE1_WEIGHTS = WEIGHTS_DIR / "eagle-smollm2.safetensors"
EAGLE3_WEIGHTS = WEIGHTS_DIR / "eagle3-smollm2.safetensors"

# the shipped heads by name; a serving configuration names one of them (or "" for the default)
EAGLE_HEADS = ("eagle1", "eagle3")


def check_eagle_head(name: str) -> str:
    """A shipped head's name, checked: "" | eagle1 | eagle3 (error names ``eagle_head``)."""
    name = name.strip()
    if name and name not in EAGLE_HEADS:
        raise BanditSpecValidationError("eagle_head", f"unknown head {name!r}; choose from {', '.join(EAGLE_HEADS)} or \"\"")
    return name
