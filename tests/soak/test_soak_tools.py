"""The soak's helpers without a server: metrics parsing, the workload mix, process probing."""

from __future__ import annotations

import os

from banditspec_client.soak import (
    DETERMINISTIC_POLICY,
    build_workload,
    leftovers,
    metric_total,
    parse_metrics,
    server_processes,
)

SCRAPE = """# HELP nv_banditspec_arm_pulls Number of decoding steps that chose the arm
# TYPE nv_banditspec_arm_pulls counter
nv_banditspec_arm_pulls{arm="pld@4",model="banditspec",version="1"} 12
nv_banditspec_arm_pulls{arm="vanilla",model="banditspec",version="1"} 3
nv_banditspec_accepted_length_bucket{arm="pld@4",model="banditspec",version="1",le="+Inf"} 12
nv_banditspec_active_sequences{model="banditspec",version="1"} 0
"""


def test_parse_metrics_and_sum_series_by_labels():
    series = parse_metrics(SCRAPE)
    assert metric_total(series, "nv_banditspec_arm_pulls") == 15
    assert metric_total(series, "nv_banditspec_arm_pulls", arm="pld@4") == 12
    assert metric_total(series, "nv_banditspec_accepted_length_bucket", le="+Inf") == 12
    assert metric_total(series, "nv_banditspec_active_sequences", model="banditspec") == 0
    assert metric_total(series, "nv_missing") == 0


def test_workload_is_seeded_and_mixed():
    cases = build_workload(400, seed=3)
    assert cases == build_workload(400, seed=3) and cases != build_workload(400, seed=4)
    kinds = {k: sum(c.kind == k for c in cases) for k in ("good", "cancel", "invalid")}
    assert kinds["good"] > 250 and 20 < kinds["cancel"] < 80 and 20 < kinds["invalid"] < 80
    assert all(c.bad_field for c in cases if c.kind == "invalid")
    assert all(c.options.stream and c.cancel_after for c in cases if c.kind == "cancel")
    repeated = [c for c in cases if c.options.policy == DETERMINISTIC_POLICY and c.kind == "good"]
    assert len({c.options.max_tokens for c in repeated}) == 1 and not any(c.options.stop_words for c in repeated)


def test_process_probe_sees_this_process_and_no_leftovers_of_a_live_one():
    (me, *children) = server_processes(os.getpid())
    assert me.role == "server" and me.rss_bytes > 0
    assert leftovers([me], wait_s=0) == ([os.getpid()], [])
