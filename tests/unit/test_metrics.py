"""banditspec.metrics without Triton: running totals, the Prometheus adapter over a fake
metric-family factory, the summary log line, and the controller hooks that feed them."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from banditspec.decoding.decoder import SpeculativeDecoder
from banditspec.errors import BanditSpecValidationError
from banditspec.metrics import (
    PrometheusMetrics,
    ServingMetrics,
    ServingStats,
    SummaryLogger,
    TargetEngineMetrics,
    build_serving_metrics,
    format_summary,
    sample_engine,
)
from banditspec.metrics.stats import EngineCacheSample, drafter_failures, failure_kind
from banditspec.serving.controller import OUTCOMES, Controller, ServingDefaults

from tests.fake_tokenizer import ByteTokenizer
from tests.fault_drafters import RaisingDrafter
from tests.mock_engine import MockEngine
from tests.unit.test_decoding import ScriptedDrafter, always_wrong, oracle
from tests.unit.test_serving import RecordingSink, inputs


class FakeMetric:
    def __init__(self, family, labels, buckets):
        self.family, self.labels, self.buckets = family, labels, buckets
        self.value = 0.0
        self.observations: list[float] = []
        self.calls = 0  # updates (in Triton each one is an IPC call)

    def increment(self, value):
        assert self.family.kind == "COUNTER" and value >= 0
        self.value += value
        self.calls += 1

    def set(self, value):
        assert self.family.kind == "GAUGE"
        self.value = value
        self.calls += 1

    def observe(self, value):
        assert self.family.kind == "HISTOGRAM"
        self.observations.append(value)
        self.calls += 1


class FakeFamily:
    def __init__(self, name, description, kind, log):
        self.name, self.description, self.kind = name, description, kind
        self.metrics: list[FakeMetric] = []
        log.append(("family", name))

    def Metric(self, labels, buckets=None):  # noqa: N802 (pb_utils spelling)
        assert (buckets is not None) == (self.kind == "HISTOGRAM")
        metric = FakeMetric(self, dict(labels), buckets)
        self.metrics.append(metric)
        return metric


class FakeFactory:
    def __init__(self):
        self.families: dict[str, FakeFamily] = {}
        self.log: list = []

    def __call__(self, name, description, kind):
        assert kind in ("COUNTER", "GAUGE", "HISTOGRAM")
        family = self.families[name] = FakeFamily(name, description, kind, self.log)
        return family

    def calls(self) -> int:
        return sum(m.calls for f in self.families.values() for m in f.metrics)

    def series(self, name, **labels) -> FakeMetric:
        found = [m for m in self.families[name].metrics if all(m.labels.get(k) == v for k, v in labels.items())]
        assert len(found) == 1, (name, labels, [m.labels for m in self.families[name].metrics])
        return found[0]


# --- pure aggregation -------------------------------------------------------------------


def test_failures_count_once_per_drafter_and_are_classified():
    assert failure_kind("deadline exceeded") == "deadline"
    assert failure_kind("propose failed: InjectedFault") == "error"
    dropped = {"pld@2": "propose failed: ValueError", "pld@4": "propose failed: ValueError", "slow": "deadline exceeded"}
    assert drafter_failures(dropped) == {("pld", "error"): 1, ("slow", "deadline"): 1}
    assert drafter_failures({"x": "start failed: OSError", "x@2": "unavailable"}) == {("x", "error"): 1}
    assert drafter_failures({}) == {}


def test_serving_stats_totals_and_mean_accepted_tokens():
    stats = ServingStats()
    stats.record_step("pld@4", drafted=4, accepted=3, emitted=4)
    stats.record_step("pld@4", drafted=4, accepted=0, emitted=1)
    stats.record_step("vanilla", drafted=0, accepted=0, emitted=1)
    stats.record_request("success", {"rest@4": "deadline exceeded"})
    stats.record_request("invalid")
    stats.set_active(3)
    snap = stats.snapshot()
    assert snap.arms["pld@4"].pulls == 2 and snap.arms["pld@4"].drafted == 8 and snap.arms["pld@4"].accepted == 3
    assert snap.arms["pld@4"].acceptance_rate == pytest.approx(3 / 8)
    assert snap.arms["vanilla"].pulls == 1
    assert snap.steps == 3 and snap.emitted_tokens == 6
    assert snap.mean_accepted_tokens == pytest.approx((3 + 3) / 3)
    assert snap.accepted_length == {3: 1, 0: 2} and snap.speculation_length == {4: 2, 0: 1}
    assert snap.requests == {"success": 1, "invalid": 1} and snap.total_requests == 2
    assert snap.drafter_failures == {("rest", "deadline"): 1}
    assert snap.active_sequences == 3
    stats.record_step("pld@4", 4, 4, 5)
    assert snap.arms["pld@4"].pulls == 2, "a snapshot must not change afterwards"


# --- Prometheus adapter -----------------------------------------------------------------


def test_prometheus_names_kinds_and_labels_follow_triton_conventions():
    factory = FakeFactory()
    PrometheusMetrics(factory, model="banditspec", version="1", max_draft_len=4, outcomes=OUTCOMES)
    assert factory.families, "families are created up front"
    for family in factory.families.values():
        assert family.name.startswith("nv_banditspec_") and not family.name.endswith("_total")
        assert family.description and family.description[0].isupper() and not family.description.endswith(".")
    kinds = {name: f.kind for name, f in factory.families.items()}
    assert kinds["nv_banditspec_arm_pulls"] == "COUNTER"
    assert kinds["nv_banditspec_active_sequences"] == "GAUGE"
    assert kinds["nv_banditspec_accepted_length"] == "HISTOGRAM"
    assert kinds["nv_banditspec_speculation_length"] == "HISTOGRAM"
    # zero-valued series exist before any request: every outcome, and the active gauge
    for outcome in OUTCOMES:
        assert factory.series("nv_banditspec_requests", outcome=outcome).value == 0
    active = factory.series("nv_banditspec_active_sequences")
    assert active.labels == {"model": "banditspec", "version": "1"} and active.value == 0


def test_prometheus_moves_with_steps_requests_and_active_sequences():
    factory = FakeFactory()
    prom = PrometheusMetrics(factory, model="banditspec", version="3", max_draft_len=4)
    prom.record_step("pld@4", drafted=4, accepted=2, emitted=3)
    prom.record_step("pld@4", drafted=4, accepted=4, emitted=5)
    prom.record_step("vanilla", drafted=0, accepted=0, emitted=1)
    prom.record_request("success", {("fault_raise", "error"): 1})
    prom.set_active(2)
    pulls = factory.series("nv_banditspec_arm_pulls", arm="pld@4")
    assert pulls.value == 2 and pulls.labels == {"model": "banditspec", "version": "3", "arm": "pld@4"}
    assert factory.series("nv_banditspec_arm_pulls", arm="vanilla").value == 1
    assert factory.series("nv_banditspec_drafted_tokens", arm="pld@4").value == 8
    assert factory.series("nv_banditspec_accepted_tokens", arm="pld@4").value == 6
    hist = factory.series("nv_banditspec_accepted_length", arm="pld@4")
    assert hist.observations == [2, 4] and hist.buckets == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert factory.series("nv_banditspec_speculation_length").observations == [4, 4, 0]
    assert factory.series("nv_banditspec_generated_tokens").value == 9
    assert factory.series("nv_banditspec_requests", outcome="success").value == 1
    assert factory.series("nv_banditspec_drafter_failures", drafter="fault_raise", kind="error").value == 1
    assert factory.series("nv_banditspec_active_sequences").value == 2
    prom.set_cost_curve([50.0, 55.0], [2.0, 0.5])  # ms; ms per 100 context tokens
    assert factory.series("nv_banditspec_verify_cost_seconds", tokens="2").value == pytest.approx(0.055)
    assert factory.series("nv_banditspec_verify_cost_context_seconds", term="round").value == pytest.approx(2e-5)
    assert factory.series("nv_banditspec_verify_cost_context_seconds", term="extra_token").value == pytest.approx(5e-6)
    with pytest.raises(BanditSpecValidationError, match="^max_draft_len"):
        PrometheusMetrics(FakeFactory(), max_draft_len=0)
    with pytest.raises(BanditSpecValidationError, match="^model"):
        PrometheusMetrics(FakeFactory(), model="")


def test_target_engine_metrics_report_the_cache_and_count_deltas():
    factory = FakeFactory()
    target = TargetEngineMetrics(factory, model="target", version="1")
    target.update(EngineCacheSample(cached_tokens=100, entries=2, capacity_tokens=4096, evictions=1, forward_passes=5))
    target.update(EngineCacheSample(cached_tokens=60, entries=1, capacity_tokens=4096, evictions=3, forward_passes=9))
    assert factory.series("nv_banditspec_target_kv_cached_tokens").value == 60
    assert factory.series("nv_banditspec_target_kv_cache_entries").value == 1
    assert factory.series("nv_banditspec_target_kv_cache_capacity_tokens").value == 4096
    assert factory.series("nv_banditspec_target_kv_cache_evictions").value == 3
    assert factory.series("nv_banditspec_target_forward_passes").value == 9


def test_sample_engine_reads_a_reference_engine(tiny_engine):
    from banditspec.engine.contract import VerifyRequest

    tiny_engine.clear()
    tiny_engine.verify([VerifyRequest(input_ids=np.arange(10, 30, dtype=np.int32))])
    sample = sample_engine(tiny_engine)
    assert sample.cached_tokens == tiny_engine.cached_tokens() > 0
    assert sample.entries >= 1 and sample.capacity_tokens >= sample.cached_tokens
    assert sample.forward_passes == tiny_engine.forward_passes


def test_close_drops_metrics_before_families():
    factory = FakeFactory()
    prom = PrometheusMetrics(factory, max_draft_len=2)
    prom.record_step("a@2", 2, 1, 2)
    prom.close()
    assert prom._registry._metrics == {} and prom._registry._families == {}


# --- summary log ------------------------------------------------------------------------


def test_summary_logger_logs_at_most_once_per_interval(caplog):
    now = [100.0]
    stats = ServingStats()
    stats.record_step("pld@4", 4, 3, 4)
    stats.record_request("success")
    summary = SummaryLogger(stats, interval_s=10, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="banditspec.metrics"):
        assert not summary.maybe_log()
        now[0] = 110.5
        assert summary.maybe_log()
        assert not summary.maybe_log()
    assert len(caplog.records) == 1
    line = caplog.records[0].getMessage()
    assert "requests 1 (success 1)" in line and "pld@4 1 pulls 3/4 accepted (75%)" in line
    with pytest.raises(BanditSpecValidationError, match="^interval_s"):
        SummaryLogger(stats, interval_s=0)


def test_format_summary_lists_drafter_failures():
    stats = ServingStats()
    stats.record_request("success", {"fault_hang@4": "deadline exceeded"})
    assert "drafter failures fault_hang/deadline 1" in format_summary(stats.snapshot())


# --- hooked to a controller -------------------------------------------------------------


def make_controller(**defaults):
    engine = MockEngine(vocab_size=257, eos_id=256, max_context=1024)
    drafters = {
        "right": ScriptedDrafter("right", oracle(engine, length_cap=3)),
        "wrong": ScriptedDrafter("wrong", always_wrong(engine)),
        "fault_raise": RaisingDrafter(),
    }
    decoder = SpeculativeDecoder.for_engine(engine, drafters)
    return Controller(decoder, engine, ByteTokenizer(), ServingDefaults(**defaults))


def text_array(*values: str):
    return np.array([[v.encode() for v in values]], dtype=object)


def test_controller_hooks_feed_stats_and_prometheus_consistently():
    controller = make_controller()
    factory = FakeFactory()
    metrics = build_serving_metrics(controller, factory, {"metrics_log_interval_s": "0"})
    seen_active = []
    controller.on_active = lambda n, inner=controller.on_active: (seen_active.append(n), inner(n))
    sink = RecordingSink()
    controller.handle(inputs(max_tokens=30, arms=text_array("right", "wrong", "fault_raise")), sink)
    assert not sink.errors
    request_stats = sink.sent[-1][1]
    controller.handle(inputs(max_tokens=0), RecordingSink())  # invalid
    snap = metrics.stats.snapshot()
    assert snap.requests == {"success": 1, "invalid": 1}
    assert seen_active == [1, 0] and snap.active_sequences == 0
    assert snap.steps == request_stats["steps"]
    assert snap.drafter_failures == {("fault_raise", "error"): 1}
    for arm, totals in request_stats["per_arm"].items():
        assert snap.arms[arm].pulls == totals["pulls"]
        assert factory.series("nv_banditspec_arm_pulls", arm=arm).value == totals["pulls"]
        assert factory.series("nv_banditspec_drafted_tokens", arm=arm).value == totals["drafted"]
        assert factory.series("nv_banditspec_accepted_tokens", arm=arm).value == totals["accepted"]
    assert factory.series("nv_banditspec_requests", outcome="invalid").value == 1
    assert factory.series("nv_banditspec_drafter_failures", drafter="fault_raise", kind="error").value == 1
    assert factory.series("nv_banditspec_generated_tokens").value == request_stats["generated_tokens"] == 30
    assert len(factory.series("nv_banditspec_speculation_length").observations) == request_stats["steps"]


def test_outcomes_busy_cancelled_and_a_failing_hook_does_not_fail_requests():
    controller = make_controller(max_concurrent_sequences=1, max_queue_size=0)
    controller.prepare()  # its warm-up requests are no requests: counted nowhere
    metrics = ServingMetrics().attach(controller)
    sink = RecordingSink(cancel_after=1)
    controller.handle(inputs(max_tokens=200, stream=np.array([[True]]), policy=text_array("vanilla")), sink)
    slot = controller.admission.acquire()  # occupy the only slot
    try:
        busy = RecordingSink()
        controller.handle(inputs(), busy)
    finally:
        slot.release()
    assert busy.errors and busy.errors[0][0] == "unavailable"
    assert metrics.stats.snapshot().requests == {"cancelled": 1, "busy": 1}

    def broken(*_):
        raise RuntimeError("metrics backend down")

    controller.on_step = controller.on_request_done = controller.on_active = broken
    ok = RecordingSink()
    controller.handle(inputs(max_tokens=12), ok)
    assert not ok.errors and ok.sent[-1][1]["generated_tokens"] == 12


class SnapshotSink(RecordingSink):
    """Records, at the final response, how many steps the exporter had seen by then."""

    def __init__(self, factory):
        super().__init__()
        self.factory = factory
        self.exported_at_final: int | None = None

    def send(self, text, stats, final):
        if final:
            self.exported_at_final = len(self.factory.series("nv_banditspec_speculation_length").observations)
        super().send(text, stats, final)


def test_steps_are_exported_off_the_step_path_and_before_the_final_response():
    controller = make_controller()
    factory = FakeFactory()
    exporter = PrometheusMetrics(factory, max_draft_len=controller.decoder.limits.max_draft_len)
    metrics = ServingMetrics(exporter=exporter, export_interval_s=3600.0).attach(controller)  # the thread never wakes
    updates_in_steps = []

    def on_step(event, inner=controller.on_step):
        before = factory.calls()
        inner(event)
        updates_in_steps.append(factory.calls() - before)

    controller.on_step = on_step
    sink = SnapshotSink(factory)
    try:
        controller.handle(inputs(max_tokens=30, arms=text_array("right", "wrong")), sink)
        stats = sink.sent[-1][1]
        assert not sink.errors and stats["steps"] > 1
        assert updates_in_steps == [0] * stats["steps"], "no metric update (IPC) within a step"
        assert sink.exported_at_final == stats["steps"], "a request's steps are exported before its final response"
        for arm, totals in stats["per_arm"].items():
            pulls = factory.series("nv_banditspec_arm_pulls", arm=arm)
            assert pulls.value == totals["pulls"] and pulls.calls == 1, "counters move once per arm per export"
        assert factory.series("nv_banditspec_generated_tokens").value == 30
    finally:
        metrics.close()


def test_the_export_thread_exports_queued_steps_and_stops_on_close():
    from banditspec.decoding.results import StepEvent

    factory = FakeFactory()
    metrics = ServingMetrics(exporter=PrometheusMetrics(factory, max_draft_len=4), export_interval_s=0.01)
    assert metrics._thread is not None and metrics._thread.is_alive()
    thread = metrics._thread
    metrics.on_step(StepEvent("pld@4", 4, 2, [1, 2, 3], False, None, 0.01))
    for _ in range(500):  # up to 5 s
        if factory.families["nv_banditspec_arm_pulls"].metrics:
            break
        thread.join(0.01)
    assert factory.series("nv_banditspec_arm_pulls", arm="pld@4").value == 1
    metrics.on_step(StepEvent("pld@4", 4, 4, [1, 2, 3, 4, 5], False, None, 0.01))
    metrics.close()  # stops the thread, exports what is left
    assert not thread.is_alive()
    assert factory.series("nv_banditspec_accepted_length", arm="pld@4").observations == [2, 4]
    with pytest.raises(ValueError, match="export_interval_s"):
        ServingMetrics(export_interval_s=0.0)


def test_build_serving_metrics_parameters():
    controller = make_controller()
    off = build_serving_metrics(controller, FakeFactory(), {"metrics": "false"})
    assert off.exporter is None and off.summary is not None
    no_factory = build_serving_metrics(controller, None, {})
    assert no_factory.exporter is None
    with pytest.raises(BanditSpecValidationError, match="^metrics_log_interval_s"):
        build_serving_metrics(controller, FakeFactory(), {"metrics_log_interval_s": "soon"})
    with pytest.raises(BanditSpecValidationError, match="^metrics_log_interval_s"):
        build_serving_metrics(controller, FakeFactory(), {"metrics_log_interval_s": "-1"})
