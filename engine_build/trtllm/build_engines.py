"""Build the TensorRT-LLM engines and the filled model repository of the GPU variant.

Where it runs: inside ``nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3`` (TensorRT-LLM
1.2.1, Triton 2.71.0, CUDA 13.3), i.e. inside the project's GPU image built ``FROM`` it
(Dockerfile), on a machine with an NVIDIA GPU. 26.07 is the newest Triton image that still
ships the TensorRT engine flow (trtllm-build + the C++ ``tensorrtllm`` backend); upstream
removed it after the 1.3 release candidates (docs/deploy.md). An engine only runs on the GPU
model and TensorRT-LLM version that built it: build where you serve.

What it does, from two Hugging Face checkpoints that share one tokenizer:

1. convert the target and the draft checkpoint to TensorRT-LLM checkpoints
   (``convert_hf.py``, or ``--convert-script`` for a TensorRT-LLM example script);
2. ``trtllm-build`` the target with ``--speculative_decoding_mode draft_tokens_external
   --max_draft_len L`` and paged context FMHA (KV-cache block reuse needs it);
3. ``trtllm-build`` the draft as a plain engine (no logits gathered: its tokens are a
   deterministic draft);
4. optionally (``--eagle-hf``), the Eagle arm: TensorRT-LLM's ``examples/eagle/convert_checkpoint.py``
   (from a v1.2.1 checkout, ``--eagle-convert-script``) merges the target and an EAGLE-1
   checkpoint, and ``trtllm-build --speculative_decoding_mode eagle`` builds it;
5. copy the tokenizer and fill ``model_repository_trtllm/`` into ``OUT/model_repository``
   (plus the ``eagle`` model from ``eagle_template/`` when step 4 ran).

Every engine's ``max_input_len`` is ``max_seq_len - 1``: the controller resends the whole
sequence (prompt + output so far) at every step, so an engine input can be as long as the
context. Chunked context keeps ``max_num_tokens`` small all the same.

``--dry-run`` prints the exact commands and the repository values, and runs nothing::

    python3 engine_build/trtllm/build_engines.py --target-hf /models/hf/target \\
        --draft-hf /models/hf/draft --out /models/trtllm --max-draft-len 4 --dry-run
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, fields
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
for _src in (REPO_ROOT / "python_backend", REPO_ROOT / "client"):  # run from a checkout without install
    if str(_src) not in sys.path:
        sys.path.append(str(_src))

from banditspec.errors import BanditSpecValidationError  # noqa: E402

NGC_IMAGE = "nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3"
TENSORRT_LLM_VERSION = "1.2.1"
TEMPLATE_REPOSITORY = REPO_ROOT / "model_repository_trtllm"
EAGLE_TEMPLATE = Path(__file__).resolve().parent / "eagle_template"
EAGLE_MODEL = "eagle"  # the Triton model of the Eagle engine
# The Eagle engine's own draft tree (upstream's examples/eagle defaults): up to 63 draft tokens
# per step in a tree of depth 4. The engine drafts and verifies inside; the controller only
# asks it for a proposal of gamma tokens, so these do not depend on L.
EAGLE_TREE_TOKENS = 63
EAGLE_LAYERS = 4
CONVERT_SCRIPT = Path(__file__).resolve().parent / "convert_hf.py"
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
    "tokenizer.model", "added_tokens.json", "chat_template.jinja", "generation_config.json", "config.json",
)
TOKENS_PER_BLOCK = 64  # max_num_tokens must be a multiple (chunked context works in whole blocks)


@dataclass(frozen=True)
class BuildSpec:
    """What to build. Lengths are in tokens; paths are as seen inside the container."""

    target_hf: Path
    draft_hf: Path
    out_dir: Path
    max_draft_len: int = 4  # L: the longest draft the target engine can verify in one step
    max_batch_size: int = 8  # sequences in flight per engine
    max_seq_len: int = 4096  # prompt + output
    max_prompt_len: int = 2048  # longest prompt a client may send (server-side limit)
    max_num_tokens: int = 8192  # tokens per engine step, all sequences together
    dtype: str = "float16"
    target_kv_fraction: float = 0.5  # kv_cache_free_gpu_mem_fraction of each engine (same GPU)
    draft_kv_fraction: float = 0.2
    convert_script: Path | None = None
    eagle_hf: Path | None = None  # an EAGLE-1 checkpoint for the target: builds the Eagle arm
    eagle_convert_script: Path | None = None  # examples/eagle/convert_checkpoint.py of TensorRT-LLM v1.2.1
    eagle_kv_fraction: float = 0.2

    @property
    def roles(self) -> tuple[str, ...]:
        return ("target", "draft", EAGLE_MODEL) if self.eagle_hf is not None else ("target", "draft")

    def __post_init__(self) -> None:
        for name in ("max_draft_len", "max_batch_size", "max_seq_len", "max_prompt_len", "max_num_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise BanditSpecValidationError(name, f"must be a positive integer, got {value!r}")
        if self.dtype not in ("float16", "bfloat16"):
            raise BanditSpecValidationError("dtype", f"must be float16 or bfloat16, got {self.dtype!r}")
        if self.max_draft_len > 16:
            raise BanditSpecValidationError("max_draft_len", "must be <= 16 (the controller's bound)")
        if self.max_prompt_len >= self.max_context:
            raise BanditSpecValidationError(
                "max_prompt_len", f"must be < max_seq_len - max_draft_len = {self.max_context} (see BuildSpec.max_context)"
            )
        if self.max_num_tokens % TOKENS_PER_BLOCK:
            raise BanditSpecValidationError("max_num_tokens", f"must be a multiple of {TOKENS_PER_BLOCK}")
        if self.eagle_hf is not None and self.max_num_tokens < self.max_batch_size * (EAGLE_TREE_TOKENS + 1):
            raise BanditSpecValidationError(
                "max_num_tokens", f"must hold one Eagle step of every sequence: >= {self.max_batch_size * (EAGLE_TREE_TOKENS + 1)}"
            )
        if self.max_num_tokens < self.max_batch_size * (self.max_draft_len + 1):
            raise BanditSpecValidationError(
                "max_num_tokens", "must hold one verification step of every sequence: "
                f">= max_batch_size * (max_draft_len + 1) = {self.max_batch_size * (self.max_draft_len + 1)}"
            )
        for name in ("target_kv_fraction", "draft_kv_fraction", "eagle_kv_fraction"):
            if not 0.0 < getattr(self, name) < 1.0:
                raise BanditSpecValidationError(name, "must be in (0, 1)")
        if self.target_kv_fraction + self.draft_kv_fraction > 0.95:
            raise BanditSpecValidationError("draft_kv_fraction", "target + draft KV fractions must stay <= 0.95")
        if self.eagle_hf is not None:
            if self.eagle_convert_script is None:
                raise BanditSpecValidationError(
                    "eagle_convert_script", "--eagle-hf needs TensorRT-LLM v1.2.1's examples/eagle/convert_checkpoint.py"
                )
            if self.target_kv_fraction + self.draft_kv_fraction + self.eagle_kv_fraction > 0.95:
                raise BanditSpecValidationError("eagle_kv_fraction", "target + draft + eagle KV fractions must stay <= 0.95")

    @property
    def max_context(self) -> int:
        """The longest sequence the controller may build: max_seq_len - max_draft_len. The
        executor cuts request_output_len so that prompt + output + the draft tokens per step
        fit max_seq_len, counting the engine's max_draft_len for a call without a draft
        (LlmRequest::validate); every verify call stays within max_context + its gamma + 1,
        so that cut never happens. A larger L costs L tokens of usable length."""
        return self.max_seq_len - self.max_draft_len

    def checkpoint_dir(self, role: str) -> Path:
        return self.out_dir / "checkpoints" / role

    def engine_dir(self, role: str) -> Path:
        return self.out_dir / "engines" / role

    @property
    def tokenizer_dir(self) -> Path:
        return self.out_dir / "tokenizer"

    @property
    def repository_dir(self) -> Path:
        return self.out_dir / "model_repository"


def convert_command(spec: BuildSpec, role: str) -> list[str]:
    if role == EAGLE_MODEL:  # the target's weights and the Eagle head in one checkpoint
        return [
            "python3", str(spec.eagle_convert_script), "--model_dir", str(spec.target_hf),
            "--eagle_model_dir", str(spec.eagle_hf), "--output_dir", str(spec.checkpoint_dir(role)),
            "--dtype", spec.dtype, "--max_draft_len", str(EAGLE_TREE_TOKENS),
            "--num_eagle_layers", str(EAGLE_LAYERS),
        ]
    hf_dir = spec.target_hf if role == "target" else spec.draft_hf
    script = spec.convert_script or CONVERT_SCRIPT
    return [
        "python3", str(script), "--model_dir", str(hf_dir), "--output_dir", str(spec.checkpoint_dir(role)),
        "--dtype", spec.dtype,
    ]


def build_command(spec: BuildSpec, role: str) -> list[str]:
    cmd = [
        "trtllm-build",
        "--checkpoint_dir", str(spec.checkpoint_dir(role)),
        "--output_dir", str(spec.engine_dir(role)),
        "--gemm_plugin", spec.dtype,
        "--gpt_attention_plugin", spec.dtype,
        "--remove_input_padding", "enable",
        "--context_fmha", "enable",
        "--use_paged_context_fmha", "enable",
        "--kv_cache_type", "paged",
        "--max_batch_size", str(spec.max_batch_size),
        "--max_input_len", str(spec.max_seq_len - 1),
        "--max_seq_len", str(spec.max_seq_len),
        "--max_num_tokens", str(spec.max_num_tokens),
        "--max_beam_width", "1",
        "--logits_dtype", "float32",
    ]
    if role == "target":
        cmd += ["--speculative_decoding_mode", "draft_tokens_external", "--max_draft_len", str(spec.max_draft_len)]
    elif role == EAGLE_MODEL:
        cmd += ["--speculative_decoding_mode", "eagle", "--max_draft_len", str(EAGLE_TREE_TOKENS)]
    # No --gather_generation_logits: nothing reads generation logits (the draft arm's tokens
    # are a deterministic draft; the target's verification needs no logits returned).
    return cmd


def plan_commands(spec: BuildSpec) -> list[list[str]]:
    """In order: convert each role (target, draft[, eagle]), then build each."""
    return [convert_command(spec, role) for role in spec.roles] + [build_command(spec, role) for role in spec.roles]


def repository_values(spec: BuildSpec) -> dict[str, dict[str, str]]:
    """Placeholder values of each model of model_repository_trtllm/ (step 4)."""
    def engine(role: str, fraction: float) -> dict[str, str]:
        return {
            "triton_max_batch_size": str(spec.max_batch_size),
            "max_queue_delay_microseconds": "0",
            "max_queue_size": str(4 * spec.max_batch_size),
            "engine_dir": str(spec.engine_dir(role)),
            "batch_scheduler_policy": "guaranteed_no_evict",
            "kv_cache_free_gpu_mem_fraction": str(fraction),
            "enable_chunked_context": "true",
            "cancellation_check_period_ms": "100",
        }

    values = {
        "target": engine("target", spec.target_kv_fraction),
        "draft": engine("draft", spec.draft_kv_fraction),
        "banditspec": {
            "tokenizer_dir": str(spec.tokenizer_dir),
            "max_context": str(spec.max_context),
            "max_draft_len": str(spec.max_draft_len),
            "max_concurrent_sequences": str(spec.max_batch_size),
            "max_prompt_tokens": str(spec.max_prompt_len),
            "max_tokens_limit": str(spec.max_context - spec.max_prompt_len),
        },
    }
    if spec.eagle_hf is not None:
        values[EAGLE_MODEL] = engine(EAGLE_MODEL, spec.eagle_kv_fraction)
    return values


def banditspec_parameters(spec: BuildSpec) -> dict[str, str]:
    """banditspec parameters set after filling: the Eagle arm is served only when built."""
    if spec.eagle_hf is None:
        return {}
    return {"drafters": "pld,suffix,rest,copy,draft,eagle", "eagle_model": EAGLE_MODEL}


def copy_tokenizer(spec: BuildSpec) -> None:
    spec.tokenizer_dir.mkdir(parents=True, exist_ok=True)
    copied = [name for name in TOKENIZER_FILES if (spec.target_hf / name).is_file()]
    if "tokenizer.json" not in copied and "tokenizer.model" not in copied:
        raise BanditSpecValidationError("target_hf", f"no tokenizer.json or tokenizer.model in {spec.target_hf}")
    for name in copied:
        shutil.copy2(spec.target_hf / name, spec.tokenizer_dir / name)


def fill_repository_step(spec: BuildSpec) -> None:
    from banditspec_server.fill_template import fill_repository, fill_template
    from banditspec_server.serve import set_parameters

    if spec.repository_dir.exists():
        shutil.rmtree(spec.repository_dir)
    values = repository_values(spec)
    eagle_values = values.pop(EAGLE_MODEL, None)
    fill_repository(TEMPLATE_REPOSITORY, spec.repository_dir, values)
    if eagle_values is not None:
        folder = spec.repository_dir / EAGLE_MODEL
        (folder / "1").mkdir(parents=True)
        text = fill_template((EAGLE_TEMPLATE / "config.pbtxt").read_text(), eagle_values)
        (folder / "config.pbtxt").write_text(text)
    extra = banditspec_parameters(spec)
    if extra:
        config = spec.repository_dir / "banditspec" / "config.pbtxt"
        config.write_text(set_parameters(config.read_text(), extra))


def check_inputs(spec: BuildSpec) -> None:
    checkpoints = [("target_hf", spec.target_hf), ("draft_hf", spec.draft_hf)]
    if spec.eagle_hf is not None:
        checkpoints.append(("eagle_hf", spec.eagle_hf))
    for name, folder in checkpoints:
        if not (folder / "config.json").is_file():
            raise BanditSpecValidationError(name, f"{folder} has no config.json (not a HF checkpoint folder)")
    target_vocab = json.loads((spec.target_hf / "config.json").read_text()).get("vocab_size")
    draft_vocab = json.loads((spec.draft_hf / "config.json").read_text()).get("vocab_size")
    if target_vocab != draft_vocab:
        raise BanditSpecValidationError(
            "draft_hf", f"vocab_size {draft_vocab} differs from the target's {target_vocab}: "
            "draft and target must share one tokenizer"
        )


def run(spec: BuildSpec, dry_run: bool, force: bool) -> int:
    commands = plan_commands(spec)
    if dry_run:
        print(f"# image: {NGC_IMAGE} (TensorRT-LLM {TENSORRT_LLM_VERSION})")
        for cmd in commands:
            print(shlex.join(cmd))
        print(f"# copy tokenizer: {spec.target_hf} -> {spec.tokenizer_dir}")
        print(f"# fill repository: {TEMPLATE_REPOSITORY} -> {spec.repository_dir}")
        print(json.dumps(repository_values(spec), indent=2, sort_keys=True))
        if banditspec_parameters(spec):
            print(f"# banditspec parameters: {json.dumps(banditspec_parameters(spec), sort_keys=True)}")
        return 0
    check_inputs(spec)
    outputs = [spec.checkpoint_dir(role) for role in spec.roles] + [spec.engine_dir(role) for role in spec.roles]
    for cmd, output in zip(commands, outputs):
        if (output / "config.json").is_file() and not force:
            print(f"# skip (exists, --force rebuilds): {output}")
            continue
        print(f"+ {shlex.join(cmd)}", flush=True)
        result = subprocess.run(cmd)
        if result.returncode != 0:
            print(f"build_engines: {cmd[0]} -> {output} failed with exit code {result.returncode}", file=sys.stderr)
            return result.returncode
    copy_tokenizer(spec)
    fill_repository_step(spec)
    print(f"model repository ready: {spec.repository_dir}")
    return 0


def parse_args(argv: list[str] | None = None) -> tuple[BuildSpec, argparse.Namespace]:
    defaults = {f.name: f.default for f in fields(BuildSpec)}
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--target-hf", type=Path, required=True, help="HF checkpoint folder of the target model")
    parser.add_argument("--draft-hf", type=Path, required=True, help="HF checkpoint folder of the draft model")
    parser.add_argument("--out", type=Path, required=True, help="output folder (checkpoints, engines, repository)")
    for name in ("max_draft_len", "max_batch_size", "max_seq_len", "max_prompt_len", "max_num_tokens"):
        parser.add_argument("--" + name.replace("_", "-"), type=int, default=defaults[name])
    for name in ("target_kv_fraction", "draft_kv_fraction", "eagle_kv_fraction"):
        parser.add_argument("--" + name.replace("_", "-"), type=float, default=defaults[name])
    parser.add_argument("--dtype", choices=("float16", "bfloat16"), default=defaults["dtype"])
    parser.add_argument("--convert-script", type=Path, help="TensorRT-LLM convert_checkpoint.py to use instead")
    parser.add_argument("--eagle-hf", type=Path, help="EAGLE-1 checkpoint of the target: also build the Eagle arm")
    parser.add_argument("--eagle-convert-script", type=Path,
                        help="examples/eagle/convert_checkpoint.py of a TensorRT-LLM v1.2.1 checkout")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    parser.add_argument("--force", action="store_true", help="rebuild outputs that already exist")
    args = parser.parse_args(argv)
    spec = BuildSpec(
        target_hf=args.target_hf, draft_hf=args.draft_hf, out_dir=args.out,
        max_draft_len=args.max_draft_len, max_batch_size=args.max_batch_size, max_seq_len=args.max_seq_len,
        max_prompt_len=args.max_prompt_len, max_num_tokens=args.max_num_tokens, dtype=args.dtype,
        target_kv_fraction=args.target_kv_fraction, draft_kv_fraction=args.draft_kv_fraction,
        convert_script=args.convert_script, eagle_hf=args.eagle_hf, eagle_convert_script=args.eagle_convert_script,
        eagle_kv_fraction=args.eagle_kv_fraction,
    )
    return spec, args


def main(argv: list[str] | None = None) -> int:
    try:
        spec, args = parse_args(argv)
        return run(spec, args.dry_run, args.force)
    except BanditSpecValidationError as exc:
        print(f"build_engines: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
