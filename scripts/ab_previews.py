"""Wall clock A/B in process: costaware with Eagle previewed every round (previews) against
Eagle pulled blind (the default), the two interleaved per prompt (order alternating), every
output compared. SmolLM2-135M fp32, 1 torch thread, 64 tokens, default settings otherwise.

    .venv/bin/python scripts/ab_previews.py PROMPTS_PER_WORKLOAD SEED OUT.json
"""

import dataclasses
import sys

import torch
from tqdm import tqdm

from banditspec_client.bench.in_process import InProcessRunner
from banditspec_client.bench.methods import parse_methods
from banditspec_client.bench.runner import RunSettings
from banditspec_client.bench.workloads import load_workload

from ab_common import WORKLOADS, report, row

torch.set_num_threads(1)
n, seed, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
base = parse_methods("costaware")[0]
methods = [dataclasses.replace(base, name="previews"), dataclasses.replace(base, name="blind")]
runner = InProcessRunner(RunSettings())
eagle = runner.shared_drafters["eagle"]
default = eagle.previews
rows = []
with tqdm(total=len(WORKLOADS) * n * 2) as bar:
    for w in WORKLOADS:
        for i, p in enumerate(load_workload(w, n, seed=seed)):
            for m in (methods if i % 2 == 0 else methods[::-1]):
                eagle.previews = m.name == "previews"
                rows.append(row(w, i, m.name, runner.run(p, m, 64)))
                bar.update()
eagle.previews = default
report(rows, "previews", "blind", out)
