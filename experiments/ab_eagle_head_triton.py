"""Wall clock A/B through Triton: costaware with the EAGLE-3 head as its ``eagle`` arm against the
same with the EAGLE-1 head. One server per head (``eagle_head`` on both the controller and the
``eagle`` model: one server holds one head), both up at once, the requests sent one at a time
and interleaved per prompt (order alternating), every output compared. SmolLM2-135M fp32, the
target on 1 torch thread, 64 tokens, default settings otherwise (each head at its shipped
cut-off and probe). Prompts: each workload's prompts SKIP .. SKIP + N - 1 in the benchmark's
order. experiments/ab_eagle_head.py is the in-process one.

    .venv/bin/python experiments/ab_eagle_head_triton.py PROMPTS_PER_WORKLOAD SKIP OUT.json [WORKLOADS]
"""

import dataclasses
import sys
from contextlib import ExitStack

from ab_common import held_out, interleaved, report, triton_runner
from banditspec.paths import cache_dir
from banditspec_client.bench.methods import parse_methods
from banditspec_client.bench.runner import RunSettings

n, skip, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
workloads = tuple(sys.argv[4].split(",")) if len(sys.argv) > 4 else ("code", "code-edit", "chat")
base = parse_methods("costaware")[0]
methods = [dataclasses.replace(base, name=head) for head in ("eagle3", "eagle1")]  # a method per head

with ExitStack() as stack:
    runners = {}
    for method in methods:
        head = {"eagle_head": method.name}
        Runner = triton_runner([method], lambda m, head=head: head, {"eagle": head})
        runners[method.name] = stack.enter_context(Runner(
            RunSettings(threads=1), [method], log_path=cache_dir() / f"ab-eagle-head-triton-{method.name}.log"))
    rows = interleaved(held_out(workloads, n, skip), methods, lambda p, m: runners[m.name].run(p, m, 64))
report(rows, methods[0].name, methods[1].name, out, workloads)
