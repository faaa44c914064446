"""The server's process tree (Linux /proc): its processes, their memory and /dev/shm regions."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    role: str  # "server", or the model a Python stub serves ("banditspec", "target", "eagle")
    rss_bytes: int
    shm_region: str | None  # the stub's /dev/shm region name


def _ppid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def _rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def server_processes(server_pid: int) -> list[ProcessInfo]:
    """The server and its children; a Python-backend stub's argv is
    ``stub <repo>/<model>/<version>/model.py <shm region> ...``."""
    out = [ProcessInfo(server_pid, "server", _rss(server_pid), None)]
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or _ppid(int(entry.name)) != server_pid:
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        is_stub = len(argv) > 2 and argv[0].endswith("triton_python_backend_stub")
        role = Path(argv[1]).parent.parent.name if is_stub else "child"
        out.append(ProcessInfo(int(entry.name), role, _rss(int(entry.name)), argv[2] if is_stub else None))
    return out


def shm_bytes(regions: set[str]) -> tuple[int, int]:
    """(how many of ``regions`` exist in /dev/shm, their total size in bytes)."""
    paths = [Path("/dev/shm") / name for name in regions]
    sizes = [p.stat().st_size for p in paths if p.exists()]
    return len(sizes), sum(sizes)


def leftovers(processes: list[ProcessInfo], wait_s: float = 5.0) -> tuple[list[int], list[str]]:
    """Processes still alive (after up to ``wait_s`` for exiting ones to go) and /dev/shm
    regions still present; call after a stop."""
    deadline = time.monotonic() + wait_s
    while True:
        alive = [p.pid for p in processes if _ppid(p.pid) is not None]
        if not alive or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    regions = [p.shm_region for p in processes if p.shm_region and (Path("/dev/shm") / p.shm_region).exists()]
    return alive, regions
