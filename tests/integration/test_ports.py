"""The free-port race, provoked against a real tritonserver: it binds its ports only after
loading every model, so a port chosen free can be taken meanwhile. A TritonServer that chose
its ports starts again on a fresh one; one told a port fails naming it; ``banditspec serve``
told a taken port exits at once naming the flag. The models here are two trivial Python
models whose start-up takes 2 s (the window in which the test takes the port)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from banditspec.paths import cache_dir
from banditspec_server.serve import PortInUseError, TritonServer, free_port, release_port

from tests.ports import take_port

pytestmark = pytest.mark.integration

MODEL_PY = '''
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        time.sleep(2)  # tritonserver listens only after this

    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[]) for _ in requests]
'''
CONFIG = '''name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "x" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "y" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters {{ key: "target_model" value: {{ string_value: "tiny" }} }}
parameters {{ key: "drafters" value: {{ string_value: "pld" }} }}
'''


@pytest.fixture
def slow_repository(tmp_path):
    for name in ("target", "banditspec"):
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "config.pbtxt").write_text(CONFIG.format(name=name))
        (tmp_path / name / "1" / "model.py").write_text(MODEL_PY)
    return tmp_path


def _group_alive(pgid: int) -> list[int]:
    alive = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) == pgid and "Z" not in (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]:
                    alive.append(int(entry.name))
            except (OSError, ProcessLookupError):
                pass
    return alive


def _log(name: str) -> Path:
    log = cache_dir() / f"ports-{name}.log"
    log.write_bytes(b"")
    return log


def test_an_automatic_port_taken_before_tritonserver_listens_is_chosen_again(slow_repository):
    server = TritonServer(model="tiny", http_port=0, grpc_port=0, metrics_port=0, source=slow_repository,
                          log_path=_log("auto"), overrides={"banditspec": {"drafters": "pld"}})
    try:
        server.start()
        first_pid, taken = server.process.pid, server.http_port
        thief = take_port(taken)  # the race: between free_port's check and tritonserver's bind
        started = time.monotonic()
        server.wait_ready(120)
        print(f"ready on http {server.http_port} after {time.monotonic() - started:.1f} s "
              f"({server.port_retries} start-up again)")
        assert server.port_retries == 1 and server.http_port != taken
        assert server.is_ready()
        assert "failed to start HTTP service" in server.log_path.read_text()
        assert _group_alive(first_pid) == []  # the failed attempt left no stub behind
        thief.getsockname()  # still ours
        thief.close()
    finally:
        server.__exit__(None, None, None)


def test_an_explicit_port_taken_before_tritonserver_listens_fails_naming_it(slow_repository):
    ports = [free_port() for _ in range(3)]
    server = TritonServer(model="tiny", http_port=ports[0], grpc_port=ports[1], metrics_port=ports[2],
                          source=slow_repository, log_path=_log("explicit"), overrides={"banditspec": {"drafters": "pld"}})
    try:
        server.start()
        pid = server.process.pid
        thief = take_port(ports[1])
        with pytest.raises(PortInUseError, match=rf"^grpc_port {ports[1]}: 127.0.0.1:{ports[1]} is already in use") as failure:
            server.wait_ready(120)
        thief.close()
        assert failure.value.flag == "--grpc-port" and server.port_retries == 0
        assert server.process is None and _group_alive(pid) == []
    finally:
        server.stop()
        for port in ports:
            release_port(port)


def test_serve_told_a_taken_port_exits_at_once_naming_the_flag():
    port = free_port()
    thief = take_port(port)
    try:
        started = time.monotonic()
        result = subprocess.run(
            [str(Path(sys.executable).parent / "banditspec"), "serve", "--model", "tiny", "--no-openai",
             "--http-port", str(port), "--grpc-port", "0", "--metrics-port", "0", "--set", "banditspec.drafters=pld,suffix"],
            capture_output=True, text=True, timeout=120,
        )
        elapsed = time.monotonic() - started
    finally:
        thief.close()
        release_port(port)
    assert result.returncode == 1, result.stderr
    assert f"--http-port {port}: 127.0.0.1:{port} is already in use" in result.stderr, result.stderr
    assert elapsed < 60, f"took {elapsed:.1f} s: the port should be checked before any model loads"
