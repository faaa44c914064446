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
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

STUB_BINARY = b"triton_python_backend_stub"
OPTIONAL_MODELS = frozenset({"eagle"})  # their death degrades service, it does not stop it
EXIT_STUB_DIED = 3


@dataclass(frozen=True)
class Stub:
    pid: int
    model: str
    region: str  # its /dev/shm region name


def _stat_fields(pid: int) -> tuple[str, int] | None:
    """(state, ppid) of a process, None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return fields[0], int(fields[1])


def list_stubs(server_pid: int) -> list[Stub]:
    """The live Python-backend stubs that ``server_pid`` started; a stub's argv is
    ``stub <repo>/<model>/<version>/model.py <shm region> ...``."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        fields = _stat_fields(pid)
        if fields is None or fields[1] != server_pid or fields[0] == "Z":
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if len(argv) > 2 and argv[0].endswith(STUB_BINARY):
            region = argv[2].decode(errors="replace").lstrip("/")
            model = Path(argv[1].decode(errors="replace")).parent.parent.name
            if region and "/" not in region:
                out.append(Stub(pid, model, region))
    return out


class StubWatch:
    """Remembers every stub of one server (pid, model, /dev/shm region) while it lives, so
    that a dead stub is noticed and its region can still be removed after the server stops."""

    def __init__(self, server_pid: int):
        self.server_pid = server_pid
        self.known: dict[int, Stub] = {}
        self.regions: set[str] = set()
        self._lock = threading.Lock()

    def poll(self) -> list[Stub]:
        """Record the live stubs; return those seen before that are now gone (dead, or a
        zombie the server has not reaped: Triton 2.51 leaves a SIGKILLed stub as one)."""
        live = {s.pid: s for s in list_stubs(self.server_pid)}
        with self._lock:
            dead = [s for pid, s in self.known.items() if pid not in live]
            for pid in [s.pid for s in dead]:
                del self.known[pid]
            self.known.update(live)
            self.regions.update(s.region for s in live.values())
        return dead


def active_sequences(metrics_port: int) -> float | None:
    """``nv_banditspec_active_sequences`` summed over models; None when unreadable."""
    from banditspec_client.prometheus_text import metric_total, scrape_metrics

    try:
        return metric_total(scrape_metrics(metrics_port), "nv_banditspec_active_sequences")
    except Exception:
        return None


class Supervisor:
    """Keeps a :class:`~banditspec_client.serve.TritonServer` serving (see the module doc)."""

    def __init__(
        self,
        server,
        *,
        on_stub_death: str = "restart",
        poll_s: float = 0.5,
        grace_s: float = 3.0,
        drain_s: float = 30.0,
        max_restarts: int = 5,
        window_s: float = 600.0,
        ready_timeout_s: float = 600.0,
        log: Callable[[str], None] | None = None,
    ):
        if on_stub_death not in ("restart", "exit"):
            raise ValueError(f"on_stub_death: expected 'restart' or 'exit', got {on_stub_death!r}")
        self.server = server
        self.on_stub_death = on_stub_death
        self.poll_s, self.grace_s, self.drain_s = poll_s, grace_s, drain_s
        self.max_restarts, self.window_s = max_restarts, window_s
        self.ready_timeout_s = ready_timeout_s
        self.log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        self.restarts: list[float] = []  # monotonic times

    def _dead_or_exited(self) -> tuple[list[Stub], bool]:
        exited = self.server.process is None or self.server.process.poll() is not None
        dead = [] if self.server.watch is None else self.server.watch.poll()
        return dead, exited

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

    def run(self, stop: threading.Event) -> int:
        """Supervise until ``stop`` is set (returns 0) or recovery is refused (non-zero).
        The server must have been started; it is stopped on return."""
        try:
            while not stop.is_set():
                dead, exited = self._dead_or_exited()
                if not dead and not exited:
                    stop.wait(self.poll_s)
                    continue
                names = ", ".join(f"{s.model} (pid {s.pid})" for s in dead) or "none"
                self.log(f"supervisor: stub died: {names}; tritonserver {'exited' if exited else 'running'}")
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
                self.server.stop(timeout=self.grace_s)
                try:
                    self.server.start()
                    self.server.wait_ready(self.ready_timeout_s)
                except (RuntimeError, TimeoutError, OSError) as exc:
                    self.log(f"supervisor: restart failed: {exc}")
                    return EXIT_STUB_DIED
                self.log(f"supervisor: tritonserver restarted and ready in {time.monotonic() - started:.1f} s")
            return 0
        finally:
            self.server.stop()
