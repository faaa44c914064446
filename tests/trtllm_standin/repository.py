"""The GPU model repository served against TensorRT-LLM stand-ins (test only).

The repository is made the way a GPU user makes it: ``build_engines.fill_repository_step``
fills ``model_repository_trtllm/`` with :func:`build_engines.repository_values` of a
:class:`BuildSpec`. ``target`` and ``draft`` keep those exact ``config.pbtxt`` files
(``backend: "tensorrtllm"``); the stand-in is installed as that backend (a Python-based
backend, :func:`backend_dir`), and each engine folder holds a ``config.json`` with the
limits trtllm-build would have written (:func:`write_engine_configs`). Only ``banditspec``
gets two test parameters (the stand-ins' tokenizer instead of a copied one).

``tensorrt_llm``: upstream's whole interface in decoupled mode (:func:`render_config`), for
streaming checks.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.trtllm_standin.standin import render_config

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
STANDIN_FILES = ("model.py", "standin.py", "contract.json")
SERVED = ("banditspec", "target", "draft")


def backend_dir(out: Path) -> Path:
    """A backend folder holding the Python backend and the stand-in as ``tensorrtllm``."""
    from banditspec_server.serve import prepare_backend_dir

    out.mkdir(parents=True, exist_ok=True)
    python = out / "python"
    if not python.exists():
        python.symlink_to(prepare_backend_dir() / "python", target_is_directory=True)
    (out / "tensorrtllm").mkdir(exist_ok=True)
    for file in STANDIN_FILES:
        shutil.copy2(HERE / file, out / "tensorrtllm" / file)
    return out


def build_spec(out: Path, *, max_seq_len: int = 256, max_prompt_len: int = 128, max_draft_len: int = 4):
    import sys

    sys.path.insert(0, str(REPO_ROOT / "engine_build" / "trtllm"))
    from build_engines import BuildSpec

    return BuildSpec(target_hf=out / "hf" / "target", draft_hf=out / "hf" / "draft", out_dir=out,
                     max_draft_len=max_draft_len, max_batch_size=4, max_seq_len=max_seq_len,
                     max_prompt_len=max_prompt_len, max_num_tokens=256)


def write_engine_configs(spec, model: str) -> None:
    """What trtllm-build writes that the backend reads: the target was built with
    --max_draft_len L (draft_tokens_external), the draft engine without a speculative mode."""
    for role, draft_len in (("target", spec.max_draft_len), ("draft", 0)):
        folder = spec.engine_dir(role)
        folder.mkdir(parents=True, exist_ok=True)
        build = {"max_input_len": spec.max_seq_len - 1, "max_seq_len": spec.max_seq_len, "max_draft_len": draft_len,
                 "plugin_config": {"tokens_per_block": 64}}
        (folder / "config.json").write_text(json.dumps({"build_config": build, "standin": {"model": model}}))


def build_repository(out: Path, *, model: str = "tiny", max_seq_len: int = 256, max_prompt_len: int = 128,
                     max_draft_len: int = 4, banditspec_params: dict[str, str] | None = None) -> tuple[Path, object]:
    """(served repository, BuildSpec): the user's fill of model_repository_trtllm/, served models only."""
    import sys

    from banditspec_server.serve import set_parameters

    spec = build_spec(out / "build", max_seq_len=max_seq_len, max_prompt_len=max_prompt_len, max_draft_len=max_draft_len)
    sys.path.insert(0, str(REPO_ROOT / "engine_build" / "trtllm"))
    from build_engines import fill_repository_step

    fill_repository_step(spec)
    write_engine_configs(spec, model)
    repository = out / "repo"
    repository.mkdir(parents=True, exist_ok=True)
    for name in SERVED:
        shutil.copytree(spec.repository_dir / name, repository / name)
    config = repository / "banditspec" / "config.pbtxt"
    config.write_text(set_parameters(config.read_text(), {"tokenizer_dir": "", "target_model": model,
                                                          **(banditspec_params or {})}))
    streaming = repository / "tensorrt_llm"
    (streaming / "1").mkdir(parents=True)
    (streaming / "config.pbtxt").write_text(render_config(
        "tensorrt_llm", decoupled=True, parameters={"gpt_model_path": str(spec.engine_dir("target")),
                                                     "exclude_input_in_output": "true"}))
    return repository, spec


def standin_server(repository: Path, backends: Path, *, model: str = "tiny", log_path: Path | None = None,
                   overrides: dict[str, dict[str, str]] | None = None):
    """A TritonServer on ``repository`` whose backend folder is ``backends`` (:func:`backend_dir`);
    ``target``/``draft`` configs are served as filled (no parameter of theirs is overridden)."""
    from banditspec_server.serve import TritonServer

    class StandInServer(TritonServer):
        def command(self) -> list[str]:
            return [f"--backend-directory={backends}" if arg.startswith("--backend-directory=") else arg
                    for arg in super().command()]

    server = StandInServer(model=model, http_port=0, grpc_port=0, metrics_port=0, log_path=log_path,
                           source=repository, overrides=overrides)
    server.overrides.pop("target", None)  # the exact GPU config has no stand-in parameter
    return server
