"""scripts/gpu_check.sh --dry-run: the GPU check's own checks against the TensorRT-LLM stand-in
(same filled configs, stand-in as backend ``tensorrtllm``) print one PASS/FAIL line each, no
traceback, and exit 0 only when none failed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_bash_syntax():
    subprocess.run(["bash", "-n", str(ROOT / "scripts" / "gpu_check.sh")], check=True)


def test_dry_run_passes_every_check_against_the_stand_in(tmp_path):
    env = {**os.environ, "GPU_CHECK_OUT": str(tmp_path / "out"), "PYTHON": sys.executable}
    run = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run"], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    lines = run.stdout.splitlines()
    assert "Traceback" not in run.stdout + run.stderr
    assert all(re.match(r"^(PASS|FAIL|INFO) ", line) for line in lines), lines
    checks = [line for line in lines if not line.startswith("INFO")]
    assert not [line for line in checks if line.startswith("FAIL")], run.stdout
    names = " ".join(checks)
    for name in ("server ready", "greedy default vs the engine's own decoding", "sampling", "KV reuse after the first step",
                 "target: tokens after a rejection", "served target tensors == upstream table"):
        assert name in names, name
    assert "INFO   speed:" in run.stdout
    assert run.returncode == 0
