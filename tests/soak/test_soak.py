"""The soak: hundreds of mixed requests against a real tritonserver (tiny model), a long-form
check (marker ``long``: ``bash scripts/test.sh --long`` runs it with 1000 requests).

Other forms: ``BANDITSPEC_SOAK_REQUESTS=3000 pytest tests/soak`` or ``banditspec soak
--requests 3000 [--model smollm2]``. The report (summary + samples) is written to
``<cache>/soak-report.json``; docs/reliability.md quotes its figures."""

from __future__ import annotations

import json
import os
from dataclasses import asdict

import pytest
from banditspec.paths import cache_dir
from banditspec_client.soak.command import soak

pytestmark = [pytest.mark.integration, pytest.mark.long]  # `bash scripts/test.sh --long`

REQUESTS = int(os.environ.get("BANDITSPEC_SOAK_REQUESTS", "200"))
CONCURRENCY = int(os.environ.get("BANDITSPEC_SOAK_CONCURRENCY", "8"))
CACHE_ENTRIES = 4  # a small target prefix cache: eviction happens all the time, under load


def test_soak_mixed_traffic_stays_correct_and_bounded():
    log = cache_dir() / "soak-tritonserver.log"
    log.write_bytes(b"")
    report = soak("tiny", REQUESTS, CONCURRENCY, seed=1, sample_every_s=2.0, target_cache_entries=CACHE_ENTRIES,
                  log_path=log)
    summary = report.summary()
    (cache_dir() / "soak-report.json").write_text(
        json.dumps({"summary": summary, "failures": report.failures, "samples": [asdict(s) for s in report.samples]}, indent=1)
    )
    print(json.dumps(summary))
    assert report.failures == [], report.failures[:10]
    # the mix really happened, and the server counted it the same way
    assert report.good > REQUESTS / 2 and report.cancelled > 0 and report.invalid > 0
    assert summary["server_outcomes"]["invalid"] == report.invalid
    assert summary["server_outcomes"]["success"] + summary["server_outcomes"]["cancelled"] == report.good + report.cancelled
    # the KV cache was exercised up to its entry bound and evicted, never past its token bound
    assert summary["kv_entries_max"] <= CACHE_ENTRIES and summary["kv_evictions"] > 0
    assert 0 < summary["kv_cached_tokens_max"] <= summary["kv_capacity_tokens"]
    assert summary["shm"]["start"] == summary["shm"]["end"]
    assert len(report.samples) >= 3 and summary["drift_groups_checked"] >= 1
    assert summary["leftover_processes"] == [] and summary["leftover_shm"] == []
