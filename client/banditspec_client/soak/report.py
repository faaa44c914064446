"""The soak's report: what ran, the samples, and every failure found."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from banditspec_client.soak.processes import leftovers, server_processes
from banditspec_client.soak.sampling import Sample
from banditspec_client.soak.workload import DETERMINISTIC_POLICY

if TYPE_CHECKING:
    from banditspec_server.serve import TritonServer

MB = 1024 * 1024


@dataclass
class SoakReport:
    requests: int = 0
    good: int = 0
    cancelled: int = 0
    invalid: int = 0
    seconds: float = 0.0
    generated_tokens: int = 0
    failures: list[str] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    drift_groups_checked: int = 0
    server_outcomes: dict[str, float] = field(default_factory=dict)
    leftover_processes: list[int] = field(default_factory=list)
    leftover_shm: list[str] = field(default_factory=list)

    def rss_mb(self, at: str) -> float:
        """Total RSS in MB of the sample "start" (before traffic), "warm" (after a fifth
        of the requests), "end" (after traffic) or "peak"."""
        if not self.samples:
            return 0.0
        if at == "peak":
            return max(s.rss_total for s in self.samples) / MB
        if at == "start":
            return self.samples[0].rss_total / MB
        if at == "end":
            return self.samples[-1].rss_total / MB
        warm = [s for s in self.samples if s.done >= self.requests / 5] or self.samples
        return warm[0].rss_total / MB

    @property
    def kv_max_tokens(self) -> float:
        return max((s.kv_cached_tokens for s in self.samples), default=0.0)

    @property
    def kv_capacity_tokens(self) -> float:
        return max((s.kv_capacity_tokens for s in self.samples), default=0.0)

    def summary(self) -> dict[str, Any]:
        first, last = (self.samples[0], self.samples[-1]) if self.samples else (None, None)
        return {
            "requests": self.requests, "good": self.good, "cancelled": self.cancelled, "invalid": self.invalid,
            "failures": len(self.failures), "seconds": round(self.seconds, 1),
            "generated_tokens": self.generated_tokens,
            "rss_mb": {k: round(self.rss_mb(k), 1) for k in ("start", "warm", "end", "peak")},
            "rss_mb_by_process_end": {k: round(v / MB, 1) for k, v in (last.rss_by_role if last else {}).items()},
            "kv_cached_tokens_max": self.kv_max_tokens, "kv_capacity_tokens": self.kv_capacity_tokens,
            "kv_entries_max": max((s.kv_entries for s in self.samples), default=0.0),
            "kv_evictions": last.kv_evictions if last else 0.0,
            "shm": {"start": [first.shm_regions, first.shm_bytes] if first else None,
                    "end": [last.shm_regions, last.shm_bytes] if last else None},
            "drift_groups_checked": self.drift_groups_checked,
            "server_outcomes": self.server_outcomes,
            "leftover_processes": self.leftover_processes, "leftover_shm": self.leftover_shm,
        }


def judge(report: SoakReport, acceptance: dict[tuple, list], rss_tolerance: float, rss_slack_mb: float) -> None:
    """Record the run's failures: ``acceptance`` holds the per-step acceptance of each
    repeated request of the deterministic arm, by (prompt, max_tokens, stop words)."""
    for key, runs in acceptance.items():
        if len(runs) > 1:
            report.drift_groups_checked += 1
            if any(r != runs[0] for r in runs):
                report.failures.append(f"acceptance of {DETERMINISTIC_POLICY} drifted on prompt {key[0][:40]!r}: {runs}")
    if report.kv_max_tokens > report.kv_capacity_tokens > 0:
        report.failures.append(f"KV cache held {report.kv_max_tokens} tokens, over its bound {report.kv_capacity_tokens}")
    first, last = report.samples[0], report.samples[-1]
    if (last.shm_regions, last.shm_bytes) != (first.shm_regions, first.shm_bytes):
        report.failures.append(f"/dev/shm changed: {first.shm_regions} regions {first.shm_bytes} B -> "
                               f"{last.shm_regions} regions {last.shm_bytes} B")
    warm, end = report.rss_mb("warm"), report.rss_mb("end")
    if end > warm * (1 + rss_tolerance) + rss_slack_mb:
        report.failures.append(f"RSS grew from {warm:.0f} MB (warm) to {end:.0f} MB")
    if last.active_sequences:
        report.failures.append(f"{last.active_sequences:.0f} sequences still active after the run")


def check_stop(server: TritonServer, report: SoakReport) -> None:
    """Stop ``server`` and record stub processes or /dev/shm regions it left behind."""
    assert server.process is not None  # started
    processes = server_processes(server.process.pid)
    server.stop()
    report.leftover_processes, report.leftover_shm = leftovers(processes)
    if report.leftover_processes or report.leftover_shm:
        report.failures.append(f"after stop: processes {report.leftover_processes}, shm {report.leftover_shm}")
