"""What ``banditspec serve`` does when a Python-backend stub dies.

Measured on Triton 2.51 (the server ``nvidia-pytriton`` carries), SIGKILL to a stub:
the python backend does not restart it; every later request to that model (directly or
through BLS) fails with "Stub process '<model>_0_0' is not healthy" while
``/v2/health/ready`` and ``/v2/models/<model>/ready`` keep answering 200; requests in flight
on a dead *decoupled* stub (``banditspec``) never get an answer; a graceful stop then waits
for an unload that never finishes (``--exit-timeout-secs``, 30 s), and the dead stub's
``/dev/shm`` region stays behind because the server is killed before it cleans up.

So the supervisor watches the stubs itself (every ``poll_s``) and, when one dies:

* ``target`` or ``banditspec``: nothing can be served any more. Restart at once: SIGTERM
  (health stops answering, requests in flight through BLS end with an error at once),
  SIGKILL after ``grace_s``, unlink every stub region seen, start a fresh server on the
  same ports, wait until it is ready.
* ``eagle``: requests still complete, losslessly, without the Eagle arm (the controller
  drops an arm whose drafter fails). Drain first: restart when no sequence is active
  (``nv_banditspec_active_sequences`` = 0) or after ``drain_s``, whichever comes first.
* more than ``max_restarts`` restarts within ``window_s``, or ``on_stub_death="exit"``:
  stop, clean up and exit non-zero, for a process manager (``docker --restart``, systemd,
  Kubernetes) to act on.
* the server exiting on its own is handled like a dead ``target``.

A stub can also stop working without dying (stopped, deadlocked, stuck in native code). The
supervisor then sees no death, so it watches progress too (:class:`HangWatch`, every
``poll_s``, for ``target``, ``eagle`` and ``banditspec``; off with ``hang_s=0``): from the metrics port, each
model's completed executions (``nv_inference_exec_count``) and Triton's backend failures
(``nv_inference_request_failure{reason="BACKEND"}``, which is what a request to a stub
Triton's own health check finds unresponsive gets: "Stub process '<model>_0_0' is not
healthy"); from ``/proc``, its stub's CPU time. A model that neither completed nor computed
anything for ``hang_s``, or whose requests fail that way, gets a probe: one tiny real
request of its own (a one-token verify for ``target``, a forget-this-sequence call for
``eagle``, over HTTP; for the decoupled ``banditspec``, a two-prompt request its ``execute``
refuses at once, over a gRPC stream). A probe waits its turn behind real batches, and any progress meanwhile
clears it, so a busy model is never judged by it: the model is *hung* when the probe is
answered "not healthy", or gets no answer within ``hang_s`` while the model made no progress
either (:class:`ProgressWatch`). A hung stub is then handled exactly as a dead one (restart,
or exit 3).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

STUB_BINARY = b"triton_python_backend_stub"
UNKNOWN_MODEL = "unknown"  # a stub that died before the watch saw it alive
OPTIONAL_MODELS = frozenset({"eagle"})  # their death degrades service, it does not stop it
EXIT_STUB_DIED = 3
DEFAULT_HANG_S = 60.0


@dataclass(frozen=True)
class Stub:
    pid: int
    model: str
    region: str  # its /dev/shm region name
    # its start time (clock ticks after boot, /proc/<pid>/stat field 22): a pid alone may name a
    # later process once the stub is reaped
    started: int = field(default=0, compare=False)


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat after the command name: state, ppid, pgrp, ... (proc(5) from its third
    field on); None when the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


_STARTED = 19  # index of the start time in _stat_fields (proc(5) field 22)


def _stub_children(server_pid: int, known: dict[int, Stub] | None = None) -> tuple[list[Stub], set[int]]:
    """(the live Python-backend stubs that ``server_pid`` started, the pids of its zombie
    children named like a stub). A stub's argv is ``stub <repo>/<model>/<version>/model.py
    <shm region> ...``; a zombie has no argv left, only its name (``comm``, 15 characters).

    A stub of ``known`` (same pid and start time) is taken from there: its argv is read once,
    when it is new. Reading /proc/<pid>/cmdline takes the process's memory-map lock and can
    block while that process faults or exits; /proc/<pid>/stat does not."""
    known = known or {}
    live, zombies = [], set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        fields = _stat_fields(pid)
        if fields is None or int(fields[1]) != server_pid:
            continue
        started = int(fields[_STARTED])
        if fields[0] in ("Z", "X"):
            try:
                name = (entry / "comm").read_bytes().strip()
            except OSError:
                continue
            if name and STUB_BINARY.startswith(name):
                zombies.add(pid)
            continue
        seen = known.get(pid)
        if seen is not None and seen.started == started:
            live.append(seen)
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if len(argv) > 2 and argv[0].endswith(STUB_BINARY):
            region = argv[2].decode(errors="replace").lstrip("/")
            model = Path(argv[1].decode(errors="replace")).parent.parent.name
            if region and "/" not in region:
                live.append(Stub(pid, model, region, started))
    return live, zombies


def list_stubs(server_pid: int) -> list[Stub]:
    """The live Python-backend stubs that ``server_pid`` started."""
    return _stub_children(server_pid)[0]


def remove_regions(regions: Iterable[str]) -> list[str]:
    """Unlink the named /dev/shm regions; returns those that were still there."""
    removed = []
    for region in sorted(regions):
        try:
            os.unlink(Path("/dev/shm") / region)
            removed.append(region)
        except FileNotFoundError:
            pass
    return removed


def group_members(pgid: int) -> Iterator[list[str]]:
    """The stat fields (:func:`_stat_fields`) of every process of group ``pgid``, zombies included."""
    for entry in Path("/proc").iterdir():
        fields = _stat_fields(int(entry.name)) if entry.name.isdigit() else None
        if fields is not None and int(fields[2]) == pgid:
            yield fields


def group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs (a zombie does not: it holds nothing, and
    an orphan may never be reaped where PID 1 does not reap)."""
    return any(fields[0] != "Z" for fields in group_members(pgid))


def group_cpu_seconds(pgid: int) -> float:
    """User + system CPU seconds of every live process of group ``pgid`` (a server and its stubs)."""
    return sum(int(fields[11]) + int(fields[12]) for fields in group_members(pgid)) / _CLOCK_TICKS


def wait_group_gone(pgid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)


class StubWatch:
    """Remembers every stub of one server (pid, model, /dev/shm region) while it lives, so
    that a dead stub is noticed and its region can still be removed after the server stops."""

    def __init__(self, server_pid: int):
        self.server_pid = server_pid
        self.known: dict[int, Stub] = {}
        self.regions: set[str] = set()
        self._reported: set[int] = set()  # pids already returned as dead
        self._lock = threading.Lock()

    def record(self) -> None:
        """Remember the live stubs and their regions; deaths stay for :meth:`poll` to report
        (the server's own ready check and stop call this, not the supervisor)."""
        with self._lock:
            known = dict(self.known)
        live = _stub_children(self.server_pid, known)[0]
        with self._lock:
            self.known.update((s.pid, s) for s in live if s.pid not in self.known or self.known[s.pid] is s)
            self.regions.update(s.region for s in live)

    def poll(self) -> list[Stub]:
        """Record the live stubs; return those seen before that are now gone (dead, or a
        zombie the server has not reaped: Triton 2.51 leaves a SIGKILLed stub as one), and,
        once each, zombie stubs never seen alive (killed between two polls: their model is
        ``UNKNOWN_MODEL``, so they count as required)."""
        with self._lock:
            known = dict(self.known)
        found, zombies = _stub_children(self.server_pid, known)
        live = {s.pid: s for s in found}
        with self._lock:
            # gone, a zombie, or its pid now names another process (another start time)
            dead = [s for pid, s in self.known.items() if pid not in live or live[pid].started != s.started]
            dead += [Stub(pid, UNKNOWN_MODEL, "") for pid in sorted(zombies)
                     if pid not in self.known and pid not in self._reported]
            for s in dead:
                if self.known.get(s.pid) is s:
                    del self.known[s.pid]
                self._reported.add(s.pid)
            self.known.update(live)
            self.regions.update(s.region for s in live.values())
        return dead


class SupervisedServer(Protocol):
    """What the supervisor uses of a :class:`~banditspec_server.serve.TritonServer`."""

    @property
    def process(self) -> subprocess.Popen[bytes] | None: ...

    @property
    def watch(self) -> StubWatch | None: ...

    @property
    def metrics_port(self) -> int: ...

    @property
    def http_url(self) -> str: ...

    @property
    def grpc_url(self) -> str: ...

    def start(self) -> object: ...

    def stop(self, timeout: float = ...) -> int | None: ...

    def wait_ready(self, timeout: float = ...) -> None: ...


PROBED_MODELS = ("target", "eagle", "banditspec")
STREAMED_PROBES = frozenset({"banditspec"})  # decoupled: probed over a gRPC stream, not HTTP infer
TARGET_PROBE = {"inputs": [  # one token in, one out: a verify call the size of a decoding step
    {"name": "input_ids", "shape": [1, 1], "datatype": "INT32", "data": [1]},
    {"name": "input_lengths", "shape": [1, 1], "datatype": "INT32", "data": [1]},
    {"name": "request_output_len", "shape": [1, 1], "datatype": "INT32", "data": [1]},
]}
EAGLE_PROBE = {"inputs": [  # forget a sequence no controller uses (the largest id): no draft, no state
    {"name": "sequence_id", "shape": [1], "datatype": "UINT64", "data": [2**64 - 1]},
    {"name": "end", "shape": [1], "datatype": "BOOL", "data": [True]},
]}
PROBES = {"target": TARGET_PROBE, "eagle": EAGLE_PROBE}
UNHEALTHY = "not healthy"  # Triton 2.51: "Stub process '<model>_0_0' is not healthy."

# probe outcomes
ANSWERED, UNHEALTHY_ANSWER, NO_ANSWER, UNREACHABLE = "answered", "unhealthy", "no answer", "unreachable"
# verdicts of ProgressWatch.observe
OK, PROBE, HUNG = "ok", "probe", "hung"
BUSY_CPU = 0.1  # a stub using this share of a core (or more) between two samples is working: progress


class ProgressWatch:
    """When one model is hung, from samples of its counters at times the caller gives (no
    clock, thread or I/O of its own: tested with a fake clock).

    Progress is a completed execution, or CPU time the stub used (at least ``BUSY_CPU`` of a
    core since the previous sample: an idle stub uses ~0, one computing a forward pass a whole
    core; a stopped or deadlocked one none). ``observe`` returns PROBE when the model made no
    progress for ``quiet_s``, or when Triton failed requests to it at the backend (its health
    check found the stub unresponsive) while it completed nothing; HUNG when a probe was
    answered "not healthy", or found no answer within ``probe_timeout_s`` while the model made
    no progress since the probe was sent. So a model that keeps completing batches, however
    slowly, or keeps computing one long batch (8 prompts of 1536 tokens are one forward pass
    of minutes on a CPU) is never judged hung; a stub spinning in a loop is not found either."""

    def __init__(self, quiet_s: float, probe_timeout_s: float):
        if not quiet_s > 0 or not probe_timeout_s > 0:
            raise ValueError(f"hang_s: expected seconds > 0, got {quiet_s!r} / {probe_timeout_s!r}")
        self.quiet_s, self.probe_timeout_s = quiet_s, probe_timeout_s
        self.executions: float | None = None
        self.failures: float | None = None
        self.progress_at: float | None = None  # last progress (or when watching began)
        self.probe_at: float | None = None  # when the probe in flight was sent
        self.cpu: tuple[float, float] | None = None  # (time, the stub's CPU seconds) at the previous sample
        self.reason = ""  # why HUNG

    def observe(self, now: float, executions: float | None, failures: float | None = None,
                cpu_s: float | None = None) -> str:
        if executions is None:  # the model is not served, or the metrics were unreadable
            return HUNG if self.reason else OK
        working = False
        if cpu_s is not None:
            if self.cpu is not None:
                then, used = self.cpu
                working = cpu_s > used and cpu_s - used >= BUSY_CPU * (now - then)
            self.cpu = (now, cpu_s)
        failing = False
        if self.executions is None or executions != self.executions or working:
            self.executions, self.progress_at = executions, now
        elif failures is not None and self.failures is not None and failures > self.failures:
            failing = True  # requests fail at the backend and nothing completes
        if failures is not None:
            self.failures = failures
        if self.reason:
            return HUNG
        assert self.progress_at is not None
        if self.probe_at is not None:
            if self.progress_at >= self.probe_at:
                return OK  # progress since: busy, not hung (the probe's answer will come)
            if now - self.probe_at >= self.probe_timeout_s:
                self.reason = f"no answer to a probe in {now - self.probe_at:.1f} s and no progress for {now - self.progress_at:.1f} s"
                return HUNG
            return OK
        if failing or now - self.progress_at >= self.quiet_s:
            return PROBE
        return OK

    def probe_sent(self, now: float) -> None:
        self.probe_at = now

    def probe_finished(self, now: float, outcome: str, detail: str = "") -> None:
        sent, self.probe_at = self.probe_at, None
        if outcome == UNHEALTHY_ANSWER:
            self.reason = f"Triton answered a probe with {detail!r}"
        elif outcome == NO_ANSWER and sent is not None and (self.progress_at is None or self.progress_at < sent):
            since = sent if self.progress_at is None else self.progress_at
            self.reason = f"no answer to a probe in {now - sent:.1f} s and no progress for {now - since:.1f} s"
        else:  # answered, or unreachable (the server is going away: its exit is seen on its own)
            self.progress_at = now


def probe_model(http_url: str, model: str, timeout_s: float) -> tuple[str, str]:
    """Send ``model`` its probe; (outcome, detail). Any answer from the model itself, an
    error included (e.g. eagle "not served here"), is ANSWERED. A model of STREAMED_PROBES is
    given the gRPC address instead (:func:`probe_streamed`)."""
    import json
    import urllib.error
    import urllib.request

    if model in STREAMED_PROBES:
        return probe_streamed(http_url, model, timeout_s)  # called with the gRPC address
    body = json.dumps(PROBES[model]).encode()
    request = urllib.request.Request(f"http://{http_url}/v2/models/{model}/infer", data=body,
                                     headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            resp.read()
            return ANSWERED, str(resp.status)
    except urllib.error.HTTPError as exc:
        text = exc.read().decode(errors="replace")
        return (UNHEALTHY_ANSWER if UNHEALTHY in text else ANSWERED), text[:200]
    except TimeoutError as exc:
        return NO_ANSWER, str(exc)
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError):
            return NO_ANSWER, str(exc.reason)
        return UNREACHABLE, str(exc.reason)
    except OSError as exc:  # reset, refused
        return UNREACHABLE, str(exc)




def probe_streamed(grpc_url: str, model: str, timeout_s: float) -> tuple[str, str]:
    """Probe a decoupled model (``banditspec``) over a gRPC stream: a request of two prompts,
    which its ``execute`` refuses at once on the stub's own thread ("send one prompt per
    request"), so the answer waits for no worker, sequence slot or target, and counts in no
    request metric. A stub that does not run gets Triton's "not healthy" instead."""
    import queue

    import numpy as np
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(grpc_url)
    try:
        text = grpcclient.InferInput("text_input", [2, 1], "BYTES")
        text.set_data_from_numpy(np.array([[b"."], [b"."]], dtype=np.object_))
        tokens = grpcclient.InferInput("max_tokens", [2, 1], "INT32")
        tokens.set_data_from_numpy(np.ones((2, 1), dtype=np.int32))
        client.start_stream(callback=lambda result, error: answers.put(error))
        client.async_stream_infer(model, [text, tokens])
        try:
            error = answers.get(timeout=timeout_s)
        except queue.Empty:
            return NO_ANSWER, f"no answer in {timeout_s:.0f} s"
        if error is None:
            return ANSWERED, "answered"
        detail = error.message() if isinstance(error, InferenceServerException) else str(error)
        status = error.status() if isinstance(error, InferenceServerException) else None
        if status is not None and status.endswith("UNAVAILABLE") and UNHEALTHY not in detail:
            return UNREACHABLE, detail[:200]
        return (UNHEALTHY_ANSWER if UNHEALTHY in detail else ANSWERED), detail[:200]
    except InferenceServerException as exc:
        return UNREACHABLE, str(exc)[:200]
    finally:
        try:
            client.stop_stream(cancel_requests=True)
            client.close()
        except Exception:
            pass


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process, None when it is gone."""
    fields = _stat_fields(pid)
    return None if fields is None else (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def model_counters(metrics_port: int, models: Iterable[str]) -> dict[str, tuple[float | None, float | None]] | None:
    """{model: (completed executions, backend failures)} from Triton's own per-model metrics;
    None when the metrics port does not answer."""
    from banditspec_client.prometheus_text import metric_value, scrape_metrics

    try:
        series = scrape_metrics(metrics_port)
    except Exception:
        return None
    return {m: (metric_value(series, "nv_inference_exec_count", model=m),
                metric_value(series, "nv_inference_request_failure", model=m, reason="BACKEND")) for m in models}


# (metrics port, models) -> {model: (completed executions, backend failures)}, None when unreadable
CountersFn = Callable[[int, tuple[str, ...]], dict[str, tuple[float | None, float | None]] | None]


class HangWatch:
    """The progress of one server's PROBED_MODELS (:class:`ProgressWatch` each),
    with their probes sent from daemon threads; ``check()`` names the hung ones. ``stubs()``
    gives each model's stub pid (for its CPU time)."""

    def __init__(self, server: SupervisedServer, hang_s: float, *, models: Iterable[str] = PROBED_MODELS,
                 clock: Callable[[], float] = time.monotonic, counters: CountersFn | None = None,
                 probe: Callable[[str, str, float], tuple[str, str]] | None = None,
                 stubs: Callable[[], dict[str, int]] | None = None,
                 cpu: Callable[[int], float | None] | None = None) -> None:
        self.server, self.hang_s, self.models = server, hang_s, tuple(models)
        self.clock = clock
        self.counters = counters or model_counters
        self.probe = probe or probe_model
        self.stubs = stubs or dict
        self.cpu = cpu or cpu_seconds
        self.watches = {m: ProgressWatch(hang_s, hang_s) for m in self.models}
        self._lock = threading.Lock()

    def _send(self, model: str) -> None:
        watch = self.watches[model]
        watch.probe_sent(self.clock())

        url = self.server.grpc_url if model in STREAMED_PROBES else self.server.http_url

        def run() -> None:
            outcome, detail = self.probe(url, model, self.hang_s)
            with self._lock:
                watch.probe_finished(self.clock(), outcome, detail)

        threading.Thread(target=run, daemon=True, name=f"probe-{model}").start()

    def check(self) -> dict[str, str]:
        """{model: why it is hung} for the models found hung now."""
        counts = self.counters(self.server.metrics_port, self.models)
        if counts is None:
            return {}
        pids = self.stubs()
        hung = {}
        with self._lock:
            now = self.clock()
            for model, watch in self.watches.items():
                executions, failures = counts.get(model, (None, None))
                cpu_s = self.cpu(pids[model]) if model in pids else None
                verdict = watch.observe(now, executions, failures, cpu_s)
                if verdict == PROBE:
                    self._send(model)
                elif verdict == HUNG:
                    hung[model] = watch.reason
        return hung


def active_sequences(metrics_port: int) -> float | None:
    """``nv_banditspec_active_sequences`` summed over models; None when unreadable."""
    from banditspec_client.prometheus_text import metric_total, scrape_metrics

    try:
        return metric_total(scrape_metrics(metrics_port), "nv_banditspec_active_sequences")
    except Exception:
        return None


def _describe(stubs: Iterable[Stub]) -> str:
    """Stubs for the log: "target (pid 11), eagle (pid 12)", or "none"."""
    return ", ".join(f"{s.model} (pid {s.pid})" for s in stubs) or "none"


RETRY_AFTER_PARAMETER = ("banditspec", "retry_after_s")
DEFAULT_STARTUP_S = 30.0  # a start-up time to tell clients before one has been measured


class Availability:
    """When the server is expected to answer again: the honest ``Retry-After`` of a server fault.

    ``serve`` marks each (re)start of tritonserver and its readiness; the last start-up's
    duration is the estimate. While a restart runs, a client is told what is left of it; while
    the server runs, the whole of it (a fault seen now means a restart is coming). Thread-safe:
    the OpenAI front end reads it while the supervisor writes it."""

    def __init__(self, startup_s: float = DEFAULT_STARTUP_S, clock: Callable[[], float] = time.monotonic):
        self.startup_s = startup_s
        self.clock = clock
        self.started_at: float | None = None  # a (re)start in progress began then
        self._lock = threading.Lock()

    def starting(self) -> None:
        with self._lock:
            self.started_at = self.clock()

    def ready(self) -> None:
        with self._lock:
            if self.started_at is not None:
                self.startup_s = self.clock() - self.started_at
            self.started_at = None

    def retry_after(self) -> int:
        """Whole seconds, at least 1."""
        with self._lock:
            left = self.startup_s if self.started_at is None else self.startup_s - (self.clock() - self.started_at)
        return max(1, math.ceil(left))


# A check of the stubs and models (/proc, the metrics port) takes milliseconds; one that took
# longer than this is logged, with the stubs it knew: it says whether a death that went
# unnoticed was missed or the check itself was blocked.
SLOW_CHECK_S = 5.0
# set (to anything): log the /proc state (state, parent) of each known stub at every check where
# it changed, for diagnosing a death the supervisor did not act on
TRACE_ENV = "BANDITSPEC_SUPERVISOR_TRACE"


class Supervisor:
    """Keeps a :class:`~banditspec_server.serve.TritonServer` serving (see the module doc)."""

    def __init__(
        self,
        server: SupervisedServer,
        *,
        on_stub_death: str = "restart",
        poll_s: float = 0.5,
        grace_s: float = 3.0,
        drain_s: float = 30.0,
        max_restarts: int = 5,
        window_s: float = 600.0,
        ready_timeout_s: float = 600.0,
        hang_s: float = DEFAULT_HANG_S,
        availability: Availability | None = None,
        log: Callable[[str], None] | None = None,
    ) -> None:
        if on_stub_death not in ("restart", "exit"):
            raise ValueError(f"on_stub_death: expected 'restart' or 'exit', got {on_stub_death!r}")
        if isinstance(hang_s, bool) or not isinstance(hang_s, (int, float)) or not hang_s >= 0:
            raise ValueError(f"hang_s: expected seconds >= 0 (0: no hang detection), got {hang_s!r}")
        self.hang_s = float(hang_s)
        self._hangs: HangWatch | None = None
        self._hangs_of: object = None  # the server process that watch belongs to
        self._hung_logged: set[str] = set()  # models whose hang was logged, for that watch
        self.server = server
        self.on_stub_death = on_stub_death
        self.poll_s, self.grace_s, self.drain_s = poll_s, grace_s, drain_s
        self.max_restarts, self.window_s = max_restarts, window_s
        self.ready_timeout_s = ready_timeout_s
        self.log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        self.restarts: list[float] = []  # monotonic times
        self.availability = availability or Availability()
        self._traced = ""  # the last line logged by _trace
        overrides = getattr(server, "overrides", None)  # an operator's own retry_after_s is kept
        self._retry_after_fixed = isinstance(overrides, dict) and RETRY_AFTER_PARAMETER[1] in overrides.get(
            RETRY_AFTER_PARAMETER[0], {})

    def _dead_or_exited(self) -> tuple[list[Stub], bool]:
        exited = self.server.process is None or self.server.process.poll() is not None
        dead = [] if self.server.watch is None else self.server.watch.poll()
        if not dead and not exited:
            dead = self._hung()
        return dead, exited

    def _hung(self) -> list[Stub]:
        """The stubs of the models found hung (see :class:`HangWatch`); a new server gets a new watch."""
        if not self.hang_s:
            return []
        if self._hangs is None or self._hangs_of is not self.server.process:
            watch = self.server.watch
            self._hangs = HangWatch(self.server, self.hang_s, stubs=lambda: {
                s.model: s.pid for s in (watch.known.values() if watch is not None else ())})
            self._hangs_of = self.server.process
            self._hung_logged = set()
        hung = self._hangs.check()
        if not hung:
            return []
        known = {} if self.server.watch is None else {s.model: s for s in self.server.watch.known.values()}
        for model, why in hung.items():
            if model not in self._hung_logged:  # once (a hung eagle is seen again at each poll of its drain)
                self._hung_logged.add(model)
                self.log(f"supervisor: {model} is hung: {why}")
        return [known.get(model, Stub(0, model, "")) for model in hung]

    def _trace(self, pids: list[int], took: float) -> None:
        """Log the /proc state of the stubs known before a check whenever it changed (TRACE_ENV)."""
        states = []
        for pid in pids:
            fields = _stat_fields(pid)
            states.append(f"{pid} gone" if fields is None else f"{pid} {fields[0]} ppid {fields[1]}")
        line = ", ".join(states) or "no stubs known"
        if line != self._traced:
            self._traced = line
            self.log(f"supervisor trace: {line} (check took {took * 1000:.0f} ms)")

    def _known_stubs(self) -> str:
        return _describe(() if self.server.watch is None else list(self.server.watch.known.values()))

    def _drain(self, stop: threading.Event) -> list[Stub]:
        """Wait until no sequence is active or ``drain_s`` passed; returns further deaths
        of required stubs (which end the drain at once)."""
        deadline = time.monotonic() + self.drain_s
        while time.monotonic() < deadline and not stop.is_set():
            dead, exited = self._dead_or_exited()
            required = [s for s in dead if s.model not in OPTIONAL_MODELS]
            if required or exited:
                return required
            if active_sequences(self.server.metrics_port) == 0:
                return []
            time.sleep(self.poll_s)
        return []

    def _tell_retry_after(self) -> None:
        """The restarted banditspec model tells clients of a down target to wait about as long as
        a start-up takes (its ``retry_after_s`` parameter)."""
        if self._retry_after_fixed:
            return
        model, key = RETRY_AFTER_PARAMETER
        overrides, source = getattr(self.server, "overrides", None), getattr(self.server, "source", None)
        try:
            has_it = source is not None and f'"{key}"' in (Path(source) / model / "config.pbtxt").read_text()
        except (OSError, TypeError):
            has_it = False  # another repository (a fake server in a test): nothing to tell
        if has_it and isinstance(overrides, dict):
            overrides.setdefault(model, {})[key] = str(math.ceil(self.availability.startup_s))

    def _sweep(self, regions: set[str]) -> None:
        """The stopped server's stub regions must be gone (its stop removed them); one still
        there is removed now and reported (seen once in CI, cause unknown: the log says which)."""
        left = remove_regions(regions)
        if left:
            self.log(f"supervisor: removed {len(left)} /dev/shm region(s) of the stopped server found after the restart: "
                     + ", ".join(left))

    def run(self, stop: threading.Event) -> int:
        """Supervise until ``stop`` is set (returns 0) or recovery is refused (non-zero).
        The server must have been started; it is stopped on return."""
        try:
            tracing = bool(os.environ.get(TRACE_ENV))
            while not stop.is_set():
                began = time.monotonic()
                watched = sorted(self.server.watch.known) if tracing and self.server.watch is not None else []
                dead, exited = self._dead_or_exited()
                took = time.monotonic() - began
                if tracing:
                    self._trace(watched, took)
                if took > SLOW_CHECK_S:
                    self.log(f"supervisor: checking the stubs and models took {took:.1f} s "
                             f"(known stubs: {self._known_stubs()})")
                if not dead and not exited:
                    stop.wait(self.poll_s)
                    continue
                names = _describe(dead)
                self.log(f"supervisor: stub died or hung: {names}; tritonserver {'exited' if exited else 'running'}")
                if dead and not exited and all(s.model in OPTIONAL_MODELS for s in dead):
                    self.log(f"supervisor: requests continue without {names}; draining (at most {self.drain_s:.0f} s)")
                    self._drain(stop)
                    if stop.is_set():
                        break
                if self.on_stub_death == "exit":
                    self.log("supervisor: stopping (on_stub_death=exit)")
                    return EXIT_STUB_DIED
                now = time.monotonic()
                self.restarts = [t for t in self.restarts if now - t < self.window_s] + [now]
                if len(self.restarts) > self.max_restarts:
                    self.log(f"supervisor: {len(self.restarts)} restarts within {self.window_s:.0f} s; giving up")
                    return EXIT_STUB_DIED
                started = time.monotonic()
                old_regions = set() if self.server.watch is None else set(self.server.watch.regions)
                self.availability.starting()
                self.server.stop(timeout=self.grace_s)
                try:
                    self._tell_retry_after()
                    self.server.start()
                    self.server.wait_ready(self.ready_timeout_s)
                except (RuntimeError, TimeoutError, OSError) as exc:
                    self.log(f"supervisor: restart failed: {exc}")
                    return EXIT_STUB_DIED
                self.availability.ready()
                self.log(f"supervisor: tritonserver restarted and ready in {time.monotonic() - started:.1f} s")
                self._sweep(old_regions)
            return 0
        finally:
            self.server.stop()
