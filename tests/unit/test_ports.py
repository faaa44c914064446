"""Ports for a tritonserver that binds them later (banditspec_server.serve): free_port picks
outside the kernel's ephemeral range and reserves the port against other processes; a
TritonServer told a taken port fails naming it, one that chose a port picks another; the
line tritonserver 2.51 writes when it cannot listen is recognised. No tritonserver here
(tests/integration/test_ports.py starts real ones)."""

from __future__ import annotations

import io
import socket
import subprocess
import sys

import pytest
from banditspec_server import serve
from banditspec_server.serve import PortInUseError, TritonServer, free_port, port_is_free, release_port

from tests.ports import take_port

# written by tritonserver 2.51 (measured) when each of its three ports is taken
HTTP_TAKEN = "E1130 20:04:34.692623 19492 main.cc:257] \"failed to start HTTP service: Unavailable - Socket '127.0.0.1:53353' already in use \""
GRPC_TAKEN = "E1130 20:04:35.896410 19545 main.cc:245] \"failed to start GRPC service: Unavailable - Socket '127.0.0.1:48221' already in use \""
METRICS_TAKEN = "E1130 20:04:37.320127 19560 main.cc:293] \"failed to start Metrics service: Unavailable - Socket '127.0.0.1:47669' already in use \""


def test_free_port_is_below_the_ephemeral_range_free_and_distinct():
    low, _ = serve._ephemeral_range()
    ports = [free_port() for _ in range(20)]
    try:
        assert len(set(ports)) == 20
        for port in ports:
            assert port_is_free("127.0.0.1", port)
            if low > 21000:
                assert 20000 <= port < low, port
    finally:
        for port in ports:
            release_port(port)


def test_a_port_reserved_by_another_process_is_never_handed_out_here():
    code = ("import sys, time; from banditspec_server.serve import free_port; "
            "print(free_port(), flush=True); sys.stdin.read()")
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        theirs = int(child.stdout.readline())
        assert not serve._reserve(theirs)  # their lock file is held
        # and free_port never returns it, even when the random choice lands on it
        picks = iter([theirs, theirs])
        original = serve._port_random.randrange
        serve._port_random.randrange = lambda a, b: next(picks, None) or original(a, b)
        try:
            mine = free_port()
        finally:
            serve._port_random.randrange = original
        assert mine != theirs
        release_port(mine)
    finally:
        child.stdin.close()
        child.wait(10)
    assert serve._reserve(theirs)  # released when that process ended
    release_port(theirs)


def test_a_port_something_listens_on_is_not_free():
    port = free_port()
    held = take_port(port)
    try:
        assert not port_is_free("127.0.0.1", port)
    finally:
        held.close()
        release_port(port)
    assert port_is_free("127.0.0.1", port)


def _server(**ports) -> TritonServer:
    return TritonServer(model="tiny", **{"http_port": 0, "grpc_port": 0, "metrics_port": 0, **ports})


def test_an_explicit_port_that_is_taken_fails_at_once_naming_it():
    port = free_port()
    held = take_port(port)
    try:
        server = _server(grpc_port=port)
        with pytest.raises(PortInUseError, match=f"^grpc_port {port}: 127.0.0.1:{port} is already in use") as failure:
            server._choose_ports()
        assert failure.value.flag == "--grpc-port" and failure.value.port == port
    finally:
        held.close()
        release_port(port)


def test_an_automatic_port_that_is_taken_is_chosen_again_until_the_server_was_ready():
    server = _server()
    server._choose_ports()
    first = server.http_port
    assert first and server.grpc_port and server.metrics_port
    held = take_port(first)
    try:
        server._choose_ports()  # a start-up again (after a failed one): moves off the taken port
        assert server.http_port != first
        server._ports_fixed = True  # once ready, a restart keeps its ports: clients know them
        server.http_port = first
        with pytest.raises(PortInUseError, match="http_port"):
            server._choose_ports()
    finally:
        held.close()
        for field in serve.PORT_FIELDS:
            release_port(getattr(server, field))


@pytest.mark.parametrize("bad", [-1, 65536, "8000", 8000.0, True, None])
def test_a_bad_port_is_refused_naming_the_field(bad):
    with pytest.raises(ValueError, match="^metrics_port: expected a port number"):
        _server(metrics_port=bad)


@pytest.mark.parametrize("line, port", [(HTTP_TAKEN, 53353), (GRPC_TAKEN, 48221), (METRICS_TAKEN, 47669)])
def test_tritonservers_port_in_use_line_is_recognised(line, port):
    stream = io.BytesIO(("I1130 starting\n" + line + "\nI1130 exiting\n").encode())
    tail = serve._OutputTail(stream, None)
    tail.thread.join(5)
    assert tail.port_in_use(wait_s=0) == port
    assert tail.last_error().startswith("E1130")


def test_output_without_that_line_names_no_port_and_is_copied_to_the_log(tmp_path):
    log = tmp_path / "server.log"
    tail = serve._OutputTail(io.BytesIO(b"I1 one\nE2 failed to load model 'target'\n"), log)
    tail.thread.join(5)
    assert tail.port_in_use(wait_s=0) is None
    assert "failed to load model" in tail.last_error()
    assert log.read_bytes() == b"I1 one\nE2 failed to load model 'target'\n"


def test_the_output_is_drained_while_the_reader_is_slow():
    """A full pipe would stall tritonserver: the tail reads whatever comes, whatever its size."""
    r, w = socket.socketpair()
    reader = r.makefile("rb")
    tail = serve._OutputTail(reader, None, keep=3)
    for _ in range(2000):
        w.sendall(b"line of log output " * 20 + b"\n")
    w.close()
    tail.thread.join(10)
    assert not tail.thread.is_alive() and len(tail.lines) == 3
