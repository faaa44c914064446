"""Wall clock A/B: costaware with the Eagle head's first-token probe (the default) against the
same with the head pulled blind (``eagle_probe`` false), the two interleaved per prompt (order
alternating), every output compared. SmolLM2-135M fp32, 1 torch thread, 64 tokens, default
settings otherwise. Prompts: each workload's prompts SKIP .. SKIP + N - 1 in the benchmark's
order (the probe was fitted on the first 100 of chat, code and code-edit; the 125th-164th are
the benchmarks' held-out ones).

    .venv/bin/python experiments/ab_eagle_probe.py in-process|triton PROMPTS_PER_WORKLOAD SKIP OUT.json [WORKLOADS]

Through Triton each setting is served by its own copy of the controller model (own cost model
and server-wide statistics), both drafting through the one ``eagle`` model.
"""

import dataclasses
import sys

import torch
from ab_common import WORKLOADS, held_out, interleaved, report, triton_runner
from banditspec_client.bench.in_process import InProcessRunner
from banditspec_client.bench.methods import parse_methods
from banditspec_client.bench.runner import RunSettings

mode, n, skip, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
workloads = tuple(sys.argv[5].split(",")) if len(sys.argv) > 5 else WORKLOADS
base = parse_methods("costaware")[0]
methods = [dataclasses.replace(base, name="probe"), dataclasses.replace(base, name="blind")]
torch.set_num_threads(1)


class LocalRunner(InProcessRunner):
    """The "blind" method's requests see the shared Eagle drafter without its probe."""

    def run(self, prompt, method, max_tokens):
        eagle = self.shared_drafters["eagle"]
        probe = eagle.probe
        if method.name == "blind":
            eagle.probe = None
        try:
            return super().run(prompt, method, max_tokens)
        finally:
            eagle.probe = probe


TritonRunner = triton_runner(methods, lambda m: {"eagle_probe": str(m.name == "probe").lower()})


if mode == "in-process":
    runner = LocalRunner(RunSettings())
    assert "eagle" in runner.adaptive_arms and runner.shared_drafters["eagle"].probe is not None
    rows = interleaved(held_out(workloads, n, skip), methods, lambda p, m: runner.run(p, m, 64))
elif mode == "triton":
    with TritonRunner(RunSettings(threads=1), methods) as runner:
        assert "eagle" in runner.adaptive_arms, runner.served
        rows = interleaved(held_out(workloads, n, skip), methods, lambda p, m: runner.run(p, m, 64))
else:
    raise SystemExit(f"mode must be in-process or triton, got {mode!r}")
report(rows, "probe", "blind", out, workloads)
