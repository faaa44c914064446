"""banditspec_client.supervisor decisions with a fake server (no tritonserver): which death
restarts at once, which drains first, when it gives up; and StubWatch over a real child
process that looks like a stub."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from banditspec_client import supervisor as sup
from banditspec_client.supervisor import Stub, StubWatch, Supervisor


class FakeProcess:
    def __init__(self):
        self.returncode = None

    def poll(self):
        return self.returncode


class FakeWatch:
    def __init__(self, deaths):
        self.deaths = list(deaths)  # one list of dead stubs per poll

    def poll(self):
        return self.deaths.pop(0) if self.deaths else []


class FakeServer:
    metrics_port = 0

    def __init__(self, deaths=(), stop_event=None, restarts_before_stop=1):
        self.events: list[str] = []
        self.process = FakeProcess()
        self.watch = FakeWatch(deaths)
        self.stop_event = stop_event
        self.restarts_before_stop = restarts_before_stop

    def stop(self, timeout=30):
        self.events.append("stop")
        self.process = None

    def start(self):
        self.events.append("start")
        self.process = FakeProcess()
        self.watch = FakeWatch([])

    def wait_ready(self, timeout=600):
        self.events.append("ready")
        if self.stop_event is not None and self.events.count("ready") >= self.restarts_before_stop:
            self.stop_event.set()


TARGET, EAGLE, BANDITSPEC = Stub(11, "target", "r1"), Stub(12, "eagle", "r2"), Stub(13, "banditspec", "r3")


def run(server, stop, **kw):
    return Supervisor(server, poll_s=0.01, log=lambda line: server.events.append(line), **kw).run(stop)


@pytest.mark.parametrize("dead", [TARGET, BANDITSPEC])
def test_a_required_stub_death_restarts_at_once(dead, monkeypatch):
    monkeypatch.setattr(sup, "active_sequences", lambda port: pytest.fail("no drain for a required stub"))
    stop = threading.Event()
    server = FakeServer(deaths=[[], [dead]], stop_event=stop)
    assert run(server, stop) == 0
    actions = [e for e in server.events if e in ("stop", "start", "ready")]
    assert actions == ["stop", "start", "ready", "stop"]  # restart, then the final stop on return


def test_an_eagle_death_drains_until_no_sequence_is_active(monkeypatch):
    active = iter([3, 2, 0])
    seen = []
    monkeypatch.setattr(sup, "active_sequences", lambda port: seen.append(1) or next(active))
    stop = threading.Event()
    server = FakeServer(deaths=[[EAGLE]], stop_event=stop)
    assert run(server, stop, drain_s=30) == 0
    assert len(seen) == 3  # polled until 0, then restarted
    assert [e for e in server.events if e in ("stop", "start", "ready")] == ["stop", "start", "ready", "stop"]


def test_the_drain_is_bounded(monkeypatch):
    monkeypatch.setattr(sup, "active_sequences", lambda port: 5)  # never idle
    stop = threading.Event()
    server = FakeServer(deaths=[[EAGLE]], stop_event=stop)
    started = time.monotonic()
    assert run(server, stop, drain_s=0.3) == 0
    assert 0.3 <= time.monotonic() - started < 5
    assert "start" in server.events


def test_a_required_death_during_the_drain_ends_it(monkeypatch):
    monkeypatch.setattr(sup, "active_sequences", lambda port: 5)
    stop = threading.Event()
    server = FakeServer(deaths=[[EAGLE], [], [TARGET]], stop_event=stop)
    started = time.monotonic()
    assert run(server, stop, drain_s=30) == 0
    assert time.monotonic() - started < 5 and "start" in server.events


def test_exit_mode_stops_and_exits_non_zero(monkeypatch):
    server = FakeServer(deaths=[[TARGET]])
    assert run(server, threading.Event(), on_stub_death="exit") == sup.EXIT_STUB_DIED
    assert server.events.count("start") == 0 and server.events[-1] == "stop"


def test_a_crash_loop_gives_up(monkeypatch):
    class Looping(FakeServer):
        def start(self):
            super().start()
            self.watch = FakeWatch([[TARGET]])  # every new server loses its target at once

    server = Looping(deaths=[[TARGET]])
    assert run(server, threading.Event(), max_restarts=2, window_s=60) == sup.EXIT_STUB_DIED
    assert server.events.count("start") == 2 and server.events[-1] == "stop"


def test_a_failed_restart_exits_non_zero():
    class Failing(FakeServer):
        def wait_ready(self, timeout=600):
            raise RuntimeError("tritonserver exited with code 1")

    server = Failing(deaths=[[TARGET]])
    assert run(server, threading.Event()) == sup.EXIT_STUB_DIED
    assert server.events[-1] == "stop"


def test_the_server_exiting_by_itself_is_restarted(monkeypatch):
    stop = threading.Event()
    server = FakeServer(stop_event=stop)
    server.process.returncode = -9
    assert run(server, stop) == 0
    assert server.events.count("start") == 1


def test_a_stop_request_ends_supervision_with_zero():
    stop = threading.Event()
    stop.set()
    server = FakeServer()
    assert run(server, stop) == 0 and server.events == ["stop"]


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="on_stub_death"):
        Supervisor(FakeServer(), on_stub_death="ignore")


def test_stub_watch_sees_a_stub_die_and_keeps_its_region(tmp_path):
    """A child whose argv looks like a stub's: ``.../triton_python_backend_stub <repo>/target/1/model.py <region>``."""
    model_py = tmp_path / "repo" / "target" / "1" / "model.py"
    model_py.parent.mkdir(parents=True)
    model_py.write_text("import time\ntime.sleep(1000)\n")
    region = "triton_python_backend_shm_region_test"
    child = subprocess.Popen([str(tmp_path / "triton_python_backend_stub"), str(model_py), region], executable=sys.executable)
    try:
        watch = StubWatch(os.getpid())
        deadline = time.monotonic() + 10
        while not watch.known and time.monotonic() < deadline:
            assert watch.poll() == []
            time.sleep(0.05)
        (stub,) = watch.known.values()
        assert (stub.pid, stub.model, stub.region) == (child.pid, "target", region)
        os.kill(child.pid, signal.SIGKILL)
        time.sleep(0.3)  # not reaped yet: a zombie counts as dead
        assert watch.poll() == [stub]
        assert watch.poll() == [] and watch.regions == {region}
    finally:
        child.kill()
        child.wait()
