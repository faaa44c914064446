"""Wall clock A/B in process: costaware with REST asked lazily (the default) against REST
asked every round, the two interleaved per prompt (order alternating), every output compared.
SmolLM2-135M fp32, 1 torch thread, 64 tokens, default settings otherwise.

    .venv/bin/python experiments/ab_lazy_rest.py PROMPTS_PER_WORKLOAD SEED OUT.json
"""

import dataclasses
import sys

import torch
from ab_common import WORKLOADS, interleaved, report
from banditspec.drafters.rest import RestDrafter
from banditspec_client.bench.in_process import InProcessRunner
from banditspec_client.bench.methods import parse_methods
from banditspec_client.bench.runner import RunSettings
from banditspec_client.bench.workloads import load_workload

torch.set_num_threads(1)
n, seed, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
base = parse_methods("costaware")[0]
methods = [dataclasses.replace(base, name="lazy"), dataclasses.replace(base, name="eager")]
runner = InProcessRunner(RunSettings())


def run(prompt, method):
    RestDrafter.traits = dataclasses.replace(RestDrafter.traits, proposes_lazily=method.name == "lazy")
    return runner.run(prompt, method, 64)


rows = interleaved([(w, load_workload(w, n, seed=seed)) for w in WORKLOADS], methods, run)
RestDrafter.traits = dataclasses.replace(RestDrafter.traits, proposes_lazily=True)
report(rows, "lazy", "eager", out)
