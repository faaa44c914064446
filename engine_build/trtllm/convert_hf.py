"""Convert a Hugging Face Llama-family checkpoint into a TensorRT-LLM checkpoint.

Runs inside the pinned NGC image (see build_engines.py), where ``tensorrt_llm`` is
installed. It does what TensorRT-LLM's ``examples/models/core/llama/convert_checkpoint.py``
does for an unquantised HF checkpoint, through the library API, so no TensorRT-LLM source
checkout is needed::

    python3 engine_build/trtllm/convert_hf.py --model_dir HF_DIR --output_dir CKPT_DIR \\
        --dtype float16 [--tp_size N]

The output folder (``config.json`` + ``rank<i>.safetensors``) is the input of
``trtllm-build --checkpoint_dir``. Other architectures: pass the matching TensorRT-LLM
example script to build_engines.py with ``--convert-script``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM")
DTYPES = ("float16", "bfloat16", "float32")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model_dir", type=Path, required=True, help="HF checkpoint (config.json, *.safetensors)")
    parser.add_argument("--output_dir", type=Path, required=True, help="TensorRT-LLM checkpoint folder to write")
    parser.add_argument("--dtype", choices=DTYPES, default="float16")
    parser.add_argument("--tp_size", type=int, default=1, help="tensor-parallel ranks to write")
    args = parser.parse_args(argv)
    if args.tp_size < 1:
        parser.error("--tp_size must be >= 1")
    return args


def check_architecture(model_dir: Path) -> str:
    """The checkpoint's architecture name; raises SystemExit when it is not a Llama family model."""
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise SystemExit(f"convert_hf: {config_path} not found (model_dir must be a HF checkpoint folder)")
    architectures = json.loads(config_path.read_text()).get("architectures") or []
    if not architectures or architectures[0] not in SUPPORTED_ARCHITECTURES:
        raise SystemExit(
            f"convert_hf: architecture {architectures or 'unknown'} is not one of {SUPPORTED_ARCHITECTURES}; "
            "use build_engines.py --convert-script with the TensorRT-LLM example for that model"
        )
    return architectures[0]


def convert(model_dir: Path, output_dir: Path, dtype: str, tp_size: int) -> None:
    """Write one TensorRT-LLM checkpoint rank per tensor-parallel rank (config.json from rank 0)."""
    from tensorrt_llm.mapping import Mapping
    from tensorrt_llm.models import LLaMAForCausalLM

    output_dir.mkdir(parents=True, exist_ok=True)
    for rank in range(tp_size):
        mapping = Mapping(world_size=tp_size, rank=rank, tp_size=tp_size, pp_size=1)
        model = LLaMAForCausalLM.from_hugging_face(str(model_dir), dtype, mapping=mapping)
        model.save_checkpoint(str(output_dir), save_config=(rank == 0))
        del model


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    architecture = check_architecture(args.model_dir)
    print(f"convert_hf: {architecture} {args.model_dir} -> {args.output_dir} ({args.dtype}, tp={args.tp_size})")
    convert(args.model_dir, args.output_dir, args.dtype, args.tp_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
