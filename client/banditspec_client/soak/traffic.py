"""The soak's traffic: the cases sent concurrently, every answer checked, the server sampled meanwhile."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from banditspec_client.prometheus_text import scrape_metrics
from banditspec_client.soak.expected import VanillaReference
from banditspec_client.soak.processes import ProcessInfo, server_processes
from banditspec_client.soak.report import SoakReport, judge
from banditspec_client.soak.sampling import Sample, take_sample
from banditspec_client.soak.workload import DETERMINISTIC_POLICY, SoakCase
from banditspec_client.triton_client import RemoteResult, TritonError, generate_grpc, generate_http

if TYPE_CHECKING:
    from banditspec_server.serve import TritonServer


class CaseRunner:
    """Sends cases to ``server`` and checks each answer against ``reference``; thread-safe."""

    def __init__(self, server: TritonServer, reference: VanillaReference, report: SoakReport) -> None:
        self.server = server
        self.reference = reference
        self.report = report
        self.lock = threading.Lock()
        self.done = 0
        self.pld_acceptance: dict[tuple, list] = {}

    def fail(self, text: str) -> None:
        with self.lock:
            self.report.failures.append(text)

    def run_case(self, case: SoakCase) -> None:
        try:
            self._run_case(case)
        except Exception as exc:  # a harness bug must fail the soak, not vanish in a thread
            self.fail(f"{case.kind} {case.options}: {type(exc).__name__}: {exc}")
        finally:
            with self.lock:
                self.done += 1

    def _call(self, case: SoakCase) -> RemoteResult:
        if case.protocol == "http":
            return generate_http(self.server.http_url, case.prompt, case.options, timeout=300)
        return generate_grpc(self.server.grpc_url, case.prompt, case.options, cancel_after=case.cancel_after, timeout=300)

    def _run_case(self, case: SoakCase) -> None:
        opts = case.options
        if case.kind == "invalid":
            assert case.bad_field is not None  # every invalid case names its field
            try:
                self._call(case)
            except TritonError as exc:
                if not str(exc).startswith(case.bad_field) or "Traceback" in str(exc):
                    self.fail(f"invalid {case.bad_field}: unclear error {str(exc)[:200]!r}")
                return
            self.fail(f"invalid {case.bad_field}: accepted ({opts})")
            return
        try:
            result = self._call(case)
        except TritonError as exc:
            self.fail(f"{case.kind} {opts.policy} {case.protocol}: error {str(exc)[:200]!r}")
            return
        expected = self.reference.text(case.prompt, opts.max_tokens, tuple(opts.stop_words))
        if case.kind == "cancel":
            if not expected.startswith(result.text):
                self.fail(f"cancelled {opts.policy}: streamed text is not a prefix of plain decoding")
            return
        if result.text != expected:
            self.fail(f"good {opts.policy} {case.protocol} max_tokens={opts.max_tokens}: differs from plain "
                      f"decoding on prompt {case.prompt[:40]!r}")
            return
        with self.lock:
            self.report.generated_tokens += int(result.stats.get("generated_tokens", 0))
            if opts.policy == DETERMINISTIC_POLICY:
                key = (case.prompt, opts.max_tokens, tuple(opts.stop_words))
                self.pld_acceptance.setdefault(key, []).append(result.stats.get("accepted"))


def _outcomes(metrics_port: int) -> dict[str, float]:
    """The server's request count per outcome (``nv_banditspec_requests``)."""
    series = scrape_metrics(metrics_port).get("nv_banditspec_requests", [])
    return {labels.get("outcome", "?"): value for labels, value in series}


def run_soak(server: TritonServer, cases: list[SoakCase], reference: VanillaReference, *, concurrency: int = 8,
             sample_every_s: float = 2.0, rss_tolerance: float = 0.15, rss_slack_mb: float = 64.0) -> SoakReport:
    """Run ``cases`` against a started :class:`~banditspec_server.serve.TritonServer`
    (the caller stops it), sampling its process tree; returns the judged report."""
    report = SoakReport(requests=len(cases))
    report.good = sum(c.kind == "good" for c in cases)
    report.cancelled = sum(c.kind == "cancel" for c in cases)
    report.invalid = sum(c.kind == "invalid" for c in cases)
    runner = CaseRunner(server, reference, report)
    for case in cases:  # references first: their cost must not look like server latency
        if case.kind != "invalid":
            reference.text(case.prompt, case.options.max_tokens, tuple(case.options.stop_words))
    assert server.process is not None  # started by the caller
    server_pid = server.process.pid
    regions = {p.shm_region for p in server_processes(server_pid) if p.shm_region}
    before = _outcomes(server.metrics_port)  # the start-up's warm-up request is not the soak's
    started = time.monotonic()

    def sample(processes: Callable[[], list[ProcessInfo]] = lambda: server_processes(server_pid),
               regions: set[str] = regions) -> Sample:
        return take_sample(server.metrics_port, started, runner.done, processes, regions)

    report.samples.append(sample())
    stop = threading.Event()

    def sampler() -> None:
        while not stop.wait(sample_every_s):
            report.samples.append(sample())

    thread = threading.Thread(target=sampler, name="soak-sampler", daemon=True)
    thread.start()
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="soak") as pool:
        list(pool.map(runner.run_case, cases))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and sample(list, set()).active_sequences > 0:
        time.sleep(0.2)  # cancelled sequences stop at their next step
    stop.set()
    thread.join()
    report.samples.append(sample())
    report.seconds = time.monotonic() - started
    after = _outcomes(server.metrics_port)
    report.server_outcomes = {outcome: value - before.get(outcome, 0.0) for outcome, value in after.items()}
    judge(report, runner.pld_acceptance, rss_tolerance, rss_slack_mb)
    return report
