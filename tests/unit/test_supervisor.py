"""banditspec_server.supervisor decisions with a fake server (no tritonserver): which death
restarts at once, which drains first, when it gives up; and StubWatch over a real child
process that looks like a stub."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from banditspec_server import supervisor as sup
from banditspec_server.supervisor import UNKNOWN_MODEL, Stub, StubWatch, Supervisor


class FakeProcess:
    def __init__(self):
        self.returncode = None

    def poll(self):
        return self.returncode


class FakeWatch:
    known: dict = {}

    def __init__(self, deaths, regions=()):
        self.deaths = list(deaths)  # one list of dead stubs per poll
        self.regions = set(regions)

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
    kw.setdefault("hang_s", 0)  # hang detection: its own tests below
    return Supervisor(server, poll_s=0.01, log=lambda line: server.events.append(line), **kw).run(stop)


@pytest.mark.parametrize("dead", [TARGET, BANDITSPEC])
def test_a_required_stub_death_restarts_at_once(dead, monkeypatch):
    monkeypatch.setattr(sup, "active_sequences", lambda port: pytest.fail("no drain for a required stub"))
    stop = threading.Event()
    server = FakeServer(deaths=[[], [dead]], stop_event=stop)
    assert run(server, stop) == 0
    actions = [e for e in server.events if e in ("stop", "start", "ready")]
    assert actions == ["stop", "start", "ready", "stop"]  # restart, then the final stop on return


def test_a_slow_check_is_logged_with_the_stubs_it_knew(monkeypatch):
    """A check of the stubs that blocked (a /proc read, the metrics port) is logged with how long
    it took and the stubs it knew; quick checks log nothing."""
    monkeypatch.setattr(sup, "SLOW_CHECK_S", 0.05)
    stop = threading.Event()
    server = FakeServer(deaths=[[], [], [TARGET]], stop_event=stop)
    polls = server.watch.poll
    slow = iter([False, True, False])

    def poll():
        if next(slow, False):
            time.sleep(0.1)
        return polls()

    server.watch.poll = poll
    server.watch.known = {13: BANDITSPEC}
    assert run(server, stop) == 0
    logged = [e for e in server.events if "took" in e]
    assert len(logged) == 1 and "banditspec (pid 13)" in logged[0], server.events


def test_a_region_of_the_stopped_server_still_there_after_the_restart_is_removed_and_reported():
    """The stopped server's stub regions must not outlive the restart, even one its stop missed."""
    import uuid
    from pathlib import Path

    left = Path("/dev/shm") / f"banditspec_test_region_{uuid.uuid4().hex}"
    left.write_bytes(b"x")
    try:
        stop = threading.Event()
        server = FakeServer([[TARGET]], stop_event=stop)
        server.watch.regions = {left.name, "banditspec_test_region_already_removed"}
        assert run(server, stop) == 0
        assert not left.exists()
        assert any(left.name in line and "removed 1" in line for line in server.events), server.events
    finally:
        left.unlink(missing_ok=True)


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


def _fake_stub(tmp_path, region: str = "triton_python_backend_shm_region_test") -> subprocess.Popen:
    """A child whose argv looks like a stub's (``.../triton_python_backend_stub <repo>/target/1/model.py
    <region>``) and whose name (comm) is a stub's, as a zombie keeps it; returns once named."""
    model_py = tmp_path / "repo" / "target" / "1" / "model.py"
    model_py.parent.mkdir(parents=True, exist_ok=True)
    model_py.write_text("open('/proc/self/comm', 'w').write('triton_python_backend_stub'[:15])\n"
                        "import time\ntime.sleep(1000)\n")
    child = subprocess.Popen([str(tmp_path / "triton_python_backend_stub"), str(model_py), region], executable=sys.executable)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child.pid}/comm").read_text().strip() != "triton_python_b":
        assert time.monotonic() < deadline, "the fake stub never named itself"
        time.sleep(0.02)
    return child


def test_stub_watch_sees_a_stub_die_and_keeps_its_region(tmp_path):
    region = "triton_python_backend_shm_region_test"
    child = _fake_stub(tmp_path, region)
    try:
        watch = StubWatch(os.getpid())
        assert watch.poll() == []
        (stub,) = watch.known.values()
        assert (stub.pid, stub.model, stub.region) == (child.pid, "target", region)
        os.kill(child.pid, signal.SIGKILL)
        time.sleep(0.3)  # not reaped yet: a zombie counts as dead
        watch.record()  # the server's own ready check / stop: remembers, reports nothing
        assert watch.poll() == [stub]
        assert watch.poll() == [] and watch.regions == {region}
    finally:
        child.kill()
        child.wait()


def test_a_stub_killed_before_the_watch_saw_it_is_reported_once(tmp_path):
    """Killed between the server's start and the watch's first look (a test killed one within
    the 0.5 s before serve noticed ready): left a zombie, it has no argv, only its name."""
    child = _fake_stub(tmp_path)
    try:
        os.kill(child.pid, signal.SIGKILL)
        time.sleep(0.3)
        watch = StubWatch(os.getpid())
        watch.record()
        assert watch.known == {}
        assert watch.poll() == [Stub(child.pid, UNKNOWN_MODEL, "")]
        assert watch.poll() == []
    finally:
        child.kill()
        child.wait()


def test_a_known_pid_that_names_another_process_now_is_a_death(tmp_path, monkeypatch):
    """A reaped stub's pid reused by a new child looks alive by its pid alone: the start time
    tells them apart. A stub already known is recognised by /proc/<pid>/stat alone (its argv,
    whose read can block while the process faults or exits, is read once)."""
    child = _fake_stub(tmp_path)
    try:
        watch = StubWatch(os.getpid())
        assert watch.poll() == []
        (stub,) = watch.known.values()
        assert stub.started > 0
        real_read = Path.read_bytes
        # only the known stub's argv is forbidden: other children of this test process (a
        # compiler or server another test left starting) are new to the watch and read once
        known_argv = Path(f"/proc/{child.pid}/cmdline")
        monkeypatch.setattr(Path, "read_bytes", lambda self: pytest.fail(f"read {self}") if self == known_argv
                            else real_read(self))
        assert watch.poll() == []  # known: no argv read
        monkeypatch.undo()
        earlier = Stub(stub.pid, stub.model, stub.region, stub.started - 1)  # the stub that had this pid before
        watch.known[stub.pid] = earlier
        dead = watch.poll()
        assert dead == [earlier] and dead[0].started == earlier.started
        assert watch.poll() == [] and watch.known[stub.pid].started == stub.started
    finally:
        child.kill()
        child.wait()


# --- a stub that hangs without dying -------------------------------------------------------

from banditspec_server.supervisor import (  # noqa: E402
    ANSWERED,
    HUNG,
    NO_ANSWER,
    OK,
    PROBE,
    UNHEALTHY_ANSWER,
    UNREACHABLE,
    HangWatch,
    ProgressWatch,
)


def test_a_busy_model_is_never_probed():
    """Executions complete, however slowly (one every 0.9 x quiet_s), for an hour: no probe."""
    w = ProgressWatch(quiet_s=10, probe_timeout_s=10)
    count = 0
    for tick in range(3600 * 2):  # every 0.5 s
        now = tick * 0.5
        if tick % 18 == 0:
            count += 1
        assert w.observe(now, count, failures=0) == OK, now


def test_an_idle_model_is_probed_once_per_quiet_period_and_an_answer_resets_it():
    w = ProgressWatch(quiet_s=10, probe_timeout_s=10)
    assert w.observe(0, 5) == OK
    assert w.observe(9.9, 5) == OK
    assert w.observe(10, 5) == PROBE
    w.probe_sent(10)
    assert w.observe(12, 5) == OK  # in flight: not sent twice
    w.probe_finished(12.1, ANSWERED)
    assert w.observe(13, 5) == OK and w.observe(22.0, 5) == OK
    assert w.observe(22.1, 5) == PROBE  # quiet_s after the answer


def test_a_probe_without_answer_and_without_progress_is_a_hang():
    w = ProgressWatch(quiet_s=10, probe_timeout_s=5)
    w.observe(0, 5)
    assert w.observe(10, 5) == PROBE
    w.probe_sent(10)
    assert w.observe(14.9, 5) == OK
    assert w.observe(15, 5) == HUNG and "no answer to a probe in 5.0 s" in w.reason
    assert w.observe(16, 6) == HUNG  # a verdict stays (the server is restarted on it)


def test_a_probe_stuck_behind_one_long_batch_is_cleared_by_that_batch():
    """A single execution longer than quiet_s (a long prefill): the probe waits behind it; the
    batch completes before the probe's deadline: progress, no verdict; the late probe answer is fine."""
    w = ProgressWatch(quiet_s=10, probe_timeout_s=10)
    w.observe(0, 5)
    assert w.observe(10, 5) == PROBE
    w.probe_sent(10)
    assert w.observe(19, 6) == OK  # the long batch completed
    assert w.observe(25, 6) == OK  # past the probe's deadline, but something completed since it was sent
    w.probe_finished(25.5, NO_ANSWER)  # even its timing out is no verdict then
    assert w.observe(26, 7) == OK and not w.reason


def test_a_stub_computing_one_batch_longer_than_both_deadlines_is_not_hung():
    """8 prompts of 1536 tokens are one forward pass of minutes on a CPU (measured: 20.6 s for
    one, 80.5 s for four, one thread): no execution completes, but the stub burns CPU."""
    w = ProgressWatch(quiet_s=10, probe_timeout_s=10)
    w.observe(0, 5, cpu_s=100.0)
    for tick in range(1, 600):  # five minutes, 0.5 s apart, ~30 % of a core (a contended machine)
        assert w.observe(tick * 0.5, 5, cpu_s=100.0 + tick * 0.15) == OK, tick
    # then it stops computing (deadlocked in a lock, or stopped): probed after quiet_s, hung after the probe's deadline
    now, cpu = 299.5, 100.0 + 599 * 0.15
    verdicts = [w.observe(now + t, 5, cpu_s=cpu + 0.001 * t) for t in (1, 5, 9.9)]
    assert verdicts == [OK, OK, OK]
    assert w.observe(now + 10.5, 5, cpu_s=cpu) == PROBE
    w.probe_sent(now + 10.5)
    assert w.observe(now + 20.4, 5, cpu_s=cpu) == OK
    assert w.observe(now + 20.5, 5, cpu_s=cpu) == HUNG


def test_idle_cpu_noise_is_not_progress():
    """An idle stub uses ~0 CPU (measured: 0-1 ticks of 10 ms in 10 s); below BUSY_CPU."""
    w = ProgressWatch(quiet_s=10, probe_timeout_s=10)
    w.observe(0, 5, cpu_s=3.0)
    assert w.observe(5, 5, cpu_s=3.01) == OK
    assert w.observe(10, 5, cpu_s=3.02) == PROBE


def test_a_probe_that_times_out_with_no_progress_is_a_hang_when_it_reports_first():
    w = ProgressWatch(quiet_s=10, probe_timeout_s=10)
    w.observe(0, 5)
    w.observe(10, 5)
    w.probe_sent(10)
    w.probe_finished(20, NO_ANSWER, "timed out")
    assert w.observe(20.1, 5) == HUNG and "no progress for 20.0 s" in w.reason


def test_backend_failures_without_progress_probe_at_once_and_not_healthy_is_a_hang():
    """SIGSTOP: Triton's health check fails requests to the stub ("not healthy") within ~1 s."""
    w = ProgressWatch(quiet_s=60, probe_timeout_s=60)
    assert w.observe(0, 5, failures=0) == OK
    assert w.observe(0.5, 5, failures=0) == OK
    assert w.observe(1.0, 5, failures=3) == PROBE  # long before quiet_s
    w.probe_sent(1.0)
    w.probe_finished(2.0, UNHEALTHY_ANSWER, "Stub process 'target_0_0' is not healthy.")
    assert w.observe(2.5, 5, failures=4) == HUNG and "not healthy" in w.reason


def test_backend_failures_while_executions_complete_are_not_suspicious():
    w = ProgressWatch(quiet_s=60, probe_timeout_s=60)
    w.observe(0, 5, failures=0)
    assert w.observe(1, 6, failures=1) == OK


def test_an_unreachable_server_is_no_verdict_and_unknown_counters_change_nothing():
    w = ProgressWatch(quiet_s=10, probe_timeout_s=10)
    w.observe(0, 5)
    assert w.observe(10, 5) == PROBE
    w.probe_sent(10)
    w.probe_finished(10.2, UNREACHABLE, "connection refused")
    assert w.observe(11, 5) == OK and not w.reason
    assert w.observe(100, None) == OK  # metrics unreadable or model not served: nothing to judge


@pytest.mark.parametrize("bad", [0, -1, float("nan")])
def test_a_nonpositive_hang_threshold_is_refused_naming_it(bad):
    with pytest.raises(ValueError, match="hang_s"):
        ProgressWatch(bad, 10)


@pytest.mark.parametrize("bad", [-1, float("nan"), "60", True])
def test_the_supervisor_refuses_a_bad_hang_seconds(bad):
    with pytest.raises(ValueError, match="hang_s"):
        Supervisor(FakeServer(), hang_s=bad)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _wait_for(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_hang_watch_probes_the_quiet_model_over_its_own_thread_and_names_the_hung_one():
    clock = Clock()
    counts = {"target": (7.0, 0.0), "eagle": (3.0, 0.0)}
    probes: list[tuple[str, float]] = []
    released = threading.Event()

    def probe(url, model, timeout_s):
        probes.append((model, timeout_s))
        if model == "target":  # the stuck model: no answer until its (real) timeout
            released.wait(10)
            return NO_ANSWER, "timed out"
        return ANSWERED, "503"

    server = FakeServer()
    server.http_url = "localhost:1"
    cpu = {11: 1.0, 12: 2.0}
    watch = HangWatch(server, 10, clock=clock, counters=lambda port, models: dict(counts), probe=probe,
                      stubs=lambda: {"target": 11, "eagle": 12}, cpu=cpu.get)
    assert watch.check() == {}
    clock.now = 5
    counts["eagle"] = (4.0, 0.0)  # eagle completes something, target nothing
    assert watch.check() == {}
    clock.now = 10
    assert watch.check() == {}  # target probed now
    _wait_for(lambda: probes == [("target", 10)])
    clock.now = 15
    assert watch.check() == {}  # eagle probed (quiet since 5 s)
    _wait_for(lambda: len(probes) == 2)
    assert probes[1] == ("eagle", 10)
    clock.now = 19.9
    assert watch.check() == {}  # eagle answered; target's probe still out, not yet hang_s old
    clock.now = 20
    hung = watch.check()  # hang_s after the probe was sent, nothing completed: hung by the clock
    released.set()
    assert list(hung) == ["target"] and "no answer to a probe in 10.0 s" in hung["target"]


def test_a_hung_target_is_restarted_like_a_dead_one(monkeypatch):
    """The supervisor's own loop: the stub of a model found hung goes the death path."""
    counts = {"target": (1.0, 0.0), "eagle": (1.0, 0.0)}
    monkeypatch.setattr(sup, "model_counters", lambda port, models: dict(counts))
    failures = iter(range(1, 10**6))

    def probe(url, model, timeout_s):
        return UNHEALTHY_ANSWER, "Stub process 'target_0_0' is not healthy."

    monkeypatch.setattr(sup, "probe_model", probe)
    monkeypatch.setattr(sup, "active_sequences", lambda port: pytest.fail("no drain for target"))
    stop = threading.Event()
    server = FakeServer(stop_event=stop)
    server.http_url = "localhost:1"
    server.watch.known = {TARGET.pid: TARGET}

    def poll():  # requests to target start failing at the backend after a few polls
        counts["target"] = (1.0, float(next(failures)))
        return []

    server.watch.poll = poll
    assert run(server, stop, hang_s=30) == 0
    assert any("target is hung" in e and "not healthy" in e for e in server.events), server.events
    assert any("stub died or hung: target (pid 11)" in e for e in server.events)
    assert [e for e in server.events if e in ("stop", "start", "ready")] == ["stop", "start", "ready", "stop"]


def test_a_hung_target_with_exit_mode_exits_3(monkeypatch):
    failures = iter(range(10**6))
    monkeypatch.setattr(sup, "model_counters", lambda port, models: {"target": (1.0, float(next(failures)))})
    monkeypatch.setattr(sup, "probe_model", lambda url, model, t: (UNHEALTHY_ANSWER, "not healthy"))
    server = FakeServer()
    server.http_url = "localhost:1"
    assert run(server, threading.Event(), on_stub_death="exit", hang_s=5) == sup.EXIT_STUB_DIED
    assert server.events.count("start") == 0 and server.events[-1] == "stop"


def test_serve_refuses_a_bad_hang_seconds_naming_the_flag(capsys):
    import argparse

    from banditspec_server import serve

    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    assert parser.parse_args(["--hang-seconds", "0"]).hang_seconds == 0
    assert parser.parse_args([]).hang_seconds == 60
    for bad in ("-1", "nan", "inf", "soon"):
        with pytest.raises(SystemExit):
            parser.parse_args(["--hang-seconds", bad])
        assert "--hang-seconds" in capsys.readouterr().err


# --- Retry-After: what clients are told while the server is down ----------------------------


def test_availability_tells_the_last_start_up_time_and_what_is_left_of_a_restart():
    clock = Clock()
    clock.now = 100.0
    availability = sup.Availability(startup_s=30, clock=clock)
    assert availability.retry_after() == 30  # nothing measured yet: the default
    availability.starting()
    clock.now += 21.4
    availability.ready()
    assert availability.retry_after() == 22  # running: a fault now means a whole restart
    availability.starting()
    clock.now += 15
    assert availability.retry_after() == 7  # restarting for 15 s of the 21.4 it took last time
    clock.now += 60
    assert availability.retry_after() == 1  # late: never 0 or negative


def test_a_restart_tells_the_new_banditspec_model_the_measured_start_up(tmp_path):
    source = tmp_path / "repo"
    (source / "banditspec").mkdir(parents=True)
    (source / "banditspec" / "config.pbtxt").write_text('parameters { key: "retry_after_s" value: { string_value: "30" } }')
    clock = Clock()
    clock.now = 100.0
    stop = threading.Event()

    class Timed(FakeServer):
        def wait_ready(self, timeout=600):
            clock.now += 12.2  # the restart takes 12.2 s
            super().wait_ready(timeout)

    server = Timed(deaths=[[TARGET]], stop_event=stop)
    server.source, server.overrides = source, {"banditspec": {"target_model": "tiny"}}
    availability = sup.Availability(startup_s=40, clock=clock)
    assert run(server, stop, availability=availability) == 0
    assert server.overrides["banditspec"]["retry_after_s"] == "40"  # told before the restart: the estimate then
    assert availability.retry_after() == 13  # measured by the restart

    kept = Timed(deaths=[[TARGET]], stop_event=threading.Event())
    kept.source, kept.overrides = source, {"banditspec": {"retry_after_s": "5"}}
    assert run(kept, kept.stop_event, availability=availability) == 0
    assert kept.overrides["banditspec"]["retry_after_s"] == "5"  # an operator's own value is kept


def test_a_quiet_banditspec_is_probed_over_grpc_and_not_healthy_is_a_hang():
    clock = Clock()
    counts = {"banditspec": (4.0, 0.0)}
    probes: list[tuple[str, str]] = []

    def probe(url, model, timeout_s):
        probes.append((url, model))
        return UNHEALTHY_ANSWER, "Stub process 'banditspec_0_0' is not healthy."

    server = FakeServer()
    server.http_url, server.grpc_url = "localhost:1", "localhost:2"
    watch = HangWatch(server, 5, models=["banditspec"], clock=clock, counters=lambda port, models: dict(counts),
                      probe=probe, stubs=lambda: {"banditspec": 13}, cpu=lambda pid: 1.0)
    assert watch.check() == {}
    clock.now = 5
    assert watch.check() == {}  # quiet for hang_s: probed
    _wait_for(lambda: probes == [("localhost:2", "banditspec")])
    _wait_for(lambda: watch.check() != {})
    assert "not healthy" in watch.check()["banditspec"]
