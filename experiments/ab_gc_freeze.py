"""Wall clock A/B through Triton: costaware served by a controller model whose loaded heap is
frozen out of Python's cyclic garbage collector (``gc_freeze`` true, the default) against
the same model without (false), the two interleaved per prompt (order alternating), every
output compared. SmolLM2-135M fp32, the target on 1 torch thread, 64 tokens, default
settings otherwise. Prompts: each workload's prompts SKIP .. SKIP + N - 1 in the
benchmark's order (the 125th-164th are the benchmarks' held-out ones).

    .venv/bin/python experiments/ab_gc_freeze.py PROMPTS_PER_WORKLOAD SKIP OUT.json [WORKLOADS]

Each setting is served by its own copy of the controller model (its own process, cost model
and server-wide statistics); the target and eagle models are shared.
"""

import dataclasses
import sys

import numpy as np
from ab_common import WORKLOADS, held_out, interleaved, report, triton_runner
from banditspec_client.bench.methods import parse_methods
from banditspec_client.bench.runner import RunSettings

n, skip, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
workloads = tuple(sys.argv[4].split(",")) if len(sys.argv) > 4 else WORKLOADS
base = parse_methods("costaware")[0]
methods = [dataclasses.replace(base, name="frozen"), dataclasses.replace(base, name="unfrozen")]
TritonRunner = triton_runner(methods, lambda m: {"gc_freeze": str(m.name == "frozen").lower()})
prompts = held_out(workloads, n, skip)
outside: dict[str, list[float]] = {m.name: [] for m in methods}  # ms outside the target, per decode step


def run(prompt, method):
    record = runner.run(prompt, method, 64)
    outside[method.name] += [s - v for s, v in zip(record.step_ms[1:], record.verify_ms[1:])]
    return record


with TritonRunner(RunSettings(threads=1), methods) as runner:
    assert "eagle" in runner.adaptive_arms, runner.served
    rows = interleaved(prompts, methods, run)
report(rows, "frozen", "unfrozen", out, workloads)
for name, values in outside.items():  # a full collection shows as one long step, not in the mean
    ms = np.sort(np.asarray(values))
    print(f"{name:9s} ms outside the target per step: p50 {np.percentile(ms, 50):.2f}  p99 {np.percentile(ms, 99):.2f}  "
          f"max {ms[-1]:.1f}  steps over 50 ms {int((ms > 50).sum())} of {ms.size}")
