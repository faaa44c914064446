"""A model repository that serves the GPU controller against TensorRT-LLM stand-ins (test only).

* ``banditspec``: ``model_repository_trtllm/banditspec`` as it ships (its ``model.py`` and its
  config template filled the way ``engine_build/trtllm/build_engines.py`` fills it), with
  the tokenizer of the stand-ins' model;
* ``target`` and ``draft``: the stand-in, declaring upstream's whole ``tensorrt_llm``
  interface (non-decoupled, as the controller calls them);
* ``tensorrt_llm``: the stand-in in decoupled mode, for streaming checks.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.trtllm_standin.standin import render_config

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
STANDIN_FILES = ("model.py", "standin.py", "contract.json")


def add_standin(repository: Path, name: str, *, decoupled: bool, model: str, max_draft_len: int) -> Path:
    folder = repository / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    for file in STANDIN_FILES:
        shutil.copy2(HERE / file, folder / "1" / file)
    params = {
        "target_model": model,
        "tokens_per_block": "32",
        "max_draft_len": str(max_draft_len),
        "exclude_input_in_output": "true",
    }
    (folder / "config.pbtxt").write_text(render_config(name, decoupled=decoupled, parameters=params))
    return folder


def build_repository(out: Path, *, model: str = "tiny", max_draft_len: int = 4, max_context: int = 512,
                     banditspec_params: dict[str, str] | None = None) -> Path:
    from banditspec_client.fill_template import fill_template
    from banditspec_client.serve import set_parameters

    out.mkdir(parents=True, exist_ok=True)
    source = REPO_ROOT / "model_repository_trtllm" / "banditspec"
    dest = out / "banditspec"
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns("__pycache__"))  # follows the model.py link
    values = {
        "tokenizer_dir": "",  # the controller then loads the tokenizer of target_model
        "max_context": str(max_context),
        "max_draft_len": str(max_draft_len),
        "max_concurrent_sequences": "4",
        "max_prompt_tokens": str(max_context // 2),
        "max_tokens_limit": str(max_context // 2),
    }
    text = fill_template((source / "config.pbtxt").read_text(), values)
    text = set_parameters(text, {"target_model": model, **(banditspec_params or {})})
    (dest / "config.pbtxt").write_text(text)
    for name in ("target", "draft"):
        add_standin(out, name, decoupled=False, model=model, max_draft_len=max_draft_len)
    add_standin(out, "tensorrt_llm", decoupled=True, model=model, max_draft_len=max_draft_len)
    return out
