"""Wall clock A/B through Triton: costaware whose learning from each step runs on a background
thread while the target verifies the next round (``bookkeeping`` "background", the default)
against the same learning within the step ("now"), the two interleaved per prompt (order
alternating), every output compared. SmolLM2-135M fp32, the target on 1 torch thread, 64
tokens, default settings otherwise. Prompts: each workload's prompts SKIP .. SKIP + N - 1 in
the benchmark's order (the 125th-164th are the benchmarks' held-out ones).

    .venv/bin/python experiments/ab_bookkeeping.py PROMPTS_PER_WORKLOAD SKIP OUT.json [WORKLOADS]

Each setting is served by its own copy of the controller model (its own process, cost model
and server-wide statistics); the target and eagle models are shared.
"""

import dataclasses
import sys

from ab_common import WORKLOADS, held_out, interleaved, report, triton_runner
from banditspec_client.bench.methods import parse_methods
from banditspec_client.bench.runner import RunSettings

n, skip, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
workloads = tuple(sys.argv[4].split(",")) if len(sys.argv) > 4 else WORKLOADS
base = parse_methods("costaware")[0]
methods = [dataclasses.replace(base, name="background"), dataclasses.replace(base, name="now")]
TritonRunner = triton_runner(methods, lambda m: {"bookkeeping": m.name})
prompts = held_out(workloads, n, skip)

with TritonRunner(RunSettings(threads=1), methods) as runner:
    assert "eagle" in runner.adaptive_arms, runner.served
    rows = interleaved(prompts, methods, lambda prompt, method: runner.run(prompt, method, 64))
report(rows, "background", "now", out, workloads)
