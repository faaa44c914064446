"""An A/A run: costaware against itself, interleaved per prompt (order alternating) exactly
as the A/B scripts run two settings, to show how far two identical settings differ on this
machine (the noise floor an A/B's per-workload figures must clear). SmolLM2-135M fp32, 1
torch thread, 64 tokens, default settings.

    .venv/bin/python experiments/ab_same.py PROMPTS_PER_WORKLOAD SKIP OUT.json
"""

import dataclasses
import sys

import torch
from ab_common import held_out, interleaved, report
from banditspec_client.bench.in_process import InProcessRunner
from banditspec_client.bench.methods import parse_methods
from banditspec_client.bench.runner import RunSettings

torch.set_num_threads(1)
n, skip, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
base = parse_methods("costaware")[0]
methods = [dataclasses.replace(base, name="a"), dataclasses.replace(base, name="b")]
runner = InProcessRunner(RunSettings())
prompts = held_out(("code", "code-edit", "chat"), n, skip)
report(interleaved(prompts, methods, lambda p, m: runner.run(p, m, 64)), "a", "b", out)
