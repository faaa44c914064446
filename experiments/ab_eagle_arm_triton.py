"""Wall clock A/B through Triton: costaware over its default arms (with the Eagle head) against
the same without the ``eagle`` arm, the two interleaved per prompt (order alternating), every
output compared. SmolLM2-135M fp32, the target on 1 torch thread, 64 tokens, default settings
otherwise. Prompts: each workload's prompts SKIP .. SKIP + N - 1 in the benchmark's order (the
125th-164th are the benchmarks' held-out ones). experiments/ab_eagle_arm.py is the in-process one.

    .venv/bin/python experiments/ab_eagle_arm_triton.py PROMPTS_PER_WORKLOAD SKIP OUT.json [WORKLOADS]

Each setting is served by its own copy of the controller model (its own cost model and
server-wide statistics); the request names its arms (the bench's way), without ``eagle`` for
the "no-eagle" setting.
"""

import dataclasses
import sys

from ab_common import WORKLOADS, held_out, interleaved, report, triton_runner
from banditspec_client.bench.methods import parse_methods
from banditspec_client.bench.runner import RunSettings

n, skip, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
workloads = tuple(sys.argv[4].split(",")) if len(sys.argv) > 4 else WORKLOADS
base = parse_methods("costaware")[0]
methods = [dataclasses.replace(base, name="with-eagle"), dataclasses.replace(base, name="no-eagle")]
TritonRunner = triton_runner(methods, lambda m: {})
prompts = held_out(workloads, n, skip)

with TritonRunner(RunSettings(threads=1), methods) as runner:
    arms = list(runner.adaptive_arms)
    assert "eagle" in arms, runner.served

    def run(prompt, method):
        runner.adaptive_arms = arms if method.name == "with-eagle" else [a for a in arms if a != "eagle"]
        try:
            return runner.run(prompt, method, 64)
        finally:
            runner.adaptive_arms = arms

    rows = interleaved(prompts, methods, run)
report(rows, "with-eagle", "no-eagle", out, workloads)
