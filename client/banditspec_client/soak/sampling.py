"""Samples of the server during a soak: memory per process, the target's KV cache, /dev/shm."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from banditspec_client.prometheus_text import metric_total, scrape_metrics
from banditspec_client.soak.processes import ProcessInfo, shm_bytes


@dataclass
class Sample:
    seconds: float
    done: int  # requests finished so far
    rss_by_role: dict[str, int]
    kv_cached_tokens: float
    kv_capacity_tokens: float
    kv_entries: float
    kv_evictions: float
    shm_regions: int
    shm_bytes: int
    active_sequences: float

    @property
    def rss_total(self) -> int:
        return sum(self.rss_by_role.values())


def take_sample(metrics_port: int, started: float, done: int, processes: Callable[[], list[ProcessInfo]],
                regions: set[str]) -> Sample:
    """One sample: ``processes()`` (the server's tree) for memory, the metrics port for the KV
    cache and the active sequences, ``regions`` in /dev/shm; ``done``: requests finished so far."""
    rss: dict[str, int] = {}
    for p in processes():
        rss[p.role] = rss.get(p.role, 0) + p.rss_bytes
    try:
        metrics = scrape_metrics(metrics_port)
    except OSError:
        metrics = {}
    count, size = shm_bytes(regions)
    return Sample(
        seconds=round(time.monotonic() - started, 2),
        done=done,
        rss_by_role=rss,
        kv_cached_tokens=metric_total(metrics, "nv_banditspec_target_kv_cached_tokens"),
        kv_capacity_tokens=metric_total(metrics, "nv_banditspec_target_kv_cache_capacity_tokens"),
        kv_entries=metric_total(metrics, "nv_banditspec_target_kv_cache_entries"),
        kv_evictions=metric_total(metrics, "nv_banditspec_target_kv_cache_evictions"),
        shm_regions=count,
        shm_bytes=size,
        active_sequences=metric_total(metrics, "nv_banditspec_active_sequences"),
    )
