"""Wall clock A/B in process: costaware with Eagle previewed every round (previews) against
Eagle pulled blind (the default), the two interleaved per prompt (order alternating), every
output compared. SmolLM2-135M fp32, 1 torch thread, 64 tokens, default settings otherwise.

    .venv/bin/python experiments/ab_previews.py PROMPTS_PER_WORKLOAD SEED OUT.json
"""

import dataclasses
import sys

import torch
from ab_common import WORKLOADS, interleaved, report
from banditspec_client.bench.in_process import InProcessRunner
from banditspec_client.bench.methods import parse_methods
from banditspec_client.bench.runner import RunSettings
from banditspec_client.bench.workloads import load_workload
from tqdm import tqdm

torch.set_num_threads(1)
n, seed, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
base = parse_methods("costaware")[0]
methods = [dataclasses.replace(base, name="previews"), dataclasses.replace(base, name="blind")]
runner = InProcessRunner(RunSettings())
eagle = runner.shared_drafters["eagle"]
default = eagle.traits.previews


def run(prompt, method):
    eagle.traits = dataclasses.replace(eagle.traits, previews=method.name == "previews")
    return runner.run(prompt, method, 64)


with tqdm(total=len(WORKLOADS) * n * 2) as bar:
    rows = interleaved([(w, load_workload(w, n, seed=seed)) for w in WORKLOADS], methods, run, bar)
eagle.traits = dataclasses.replace(eagle.traits, previews=default)
report(rows, "previews", "blind", out)
