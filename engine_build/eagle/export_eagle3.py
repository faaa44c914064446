"""Write the shipped EAGLE-3 head as an upstream-style checkpoint folder (model.safetensors +
config.json: ``LlamaForCausalLMEagle3`` keys, ``d2t`` / ``t2d`` vocabulary maps), the layout
EAGLE-3 loaders read (README.md beside this file, "EAGLE-3 checkpoint").

    .venv/bin/python engine_build/eagle/export_eagle3.py OUT_DIR [--weights W.safetensors]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from banditspec.drafters.eagle import EAGLE3_WEIGHTS
from banditspec.eagle.head3 import load_head3
from banditspec_train.eagle.export import export_upstream


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", type=Path)
    parser.add_argument("--weights", type=Path, default=EAGLE3_WEIGHTS)
    parser.add_argument("--model", default="smollm2")
    args = parser.parse_args()
    from banditspec.engine.models import model_dir
    from transformers import AutoConfig

    target_config = AutoConfig.from_pretrained(model_dir(args.model))
    folder = export_upstream(load_head3(args.weights), target_config, args.out)
    print(f"wrote {folder / 'model.safetensors'} and {folder / 'config.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
