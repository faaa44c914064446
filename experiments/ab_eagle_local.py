"""Wall clock A/B through Triton: costaware with the Eagle head in the `eagle` model over BLS
(eagle_model "eagle", the default) against the head inside the controller model
(eagle_model ""), the two interleaved per prompt (order alternating), every output compared.
SmolLM2-135M fp32, 1 torch thread, 64 tokens, default settings otherwise.

    .venv/bin/python experiments/ab_eagle_local.py PROMPTS_PER_WORKLOAD SEED OUT.json
"""

import dataclasses
import sys

from ab_common import WORKLOADS, interleaved, report, triton_runner
from banditspec_client.bench.methods import parse_methods
from banditspec_client.bench.runner import RunSettings
from banditspec_client.bench.workloads import load_workload

n, seed, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
base = parse_methods("costaware")[0]
methods = [dataclasses.replace(base, name="remote"), dataclasses.replace(base, name="local")]
EAGLE_MODEL = {"remote": "eagle", "local": ""}
Runner = triton_runner(methods, lambda m: {"eagle_model": EAGLE_MODEL[m.name]})

with Runner(RunSettings(threads=1), methods) as runner:
    rows = interleaved([(w, load_workload(w, n, seed=seed)) for w in WORKLOADS], methods,
                       lambda p, m: runner.run(p, m, 64))
report(rows, "local", "remote", out)
