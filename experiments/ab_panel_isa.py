"""Wall clock A/B in process: the panel GEMM on AVX-512 (the default where the CPU has it)
against AVX2, for plain decoding and costaware, the two widths interleaved per prompt (order
alternating; the width switched in the same process), every output compared. SmolLM2-135M
fp32, 1 torch thread, 64 tokens, default settings otherwise. Needs a CPU with AVX-512F.

    .venv/bin/python experiments/ab_panel_isa.py PROMPTS_PER_WORKLOAD SEED OUT.json
"""

import dataclasses
import sys

import torch
from ab_common import WORKLOADS, report, row
from banditspec.engine import panel_kernel
from banditspec_client.bench.in_process import InProcessRunner
from banditspec_client.bench.methods import parse_methods
from banditspec_client.bench.runner import RunSettings
from banditspec_client.bench.workloads import load_workload

torch.set_num_threads(1)
n, seed, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
library = panel_kernel.load()
if library is None or not library.bs_panel_avx512_ok():
    sys.exit("needs the panel kernel on a CPU with AVX-512F")
runner = InProcessRunner(RunSettings())
widths = ("avx512", "avx2")
rows = []
for w in WORKLOADS:
    for i, p in enumerate(load_workload(w, n, seed=seed)):
        for base in parse_methods("vanilla,costaware"):
            for width in (widths if i % 2 == 0 else widths[::-1]):
                panel_kernel.set_isa(library, width)
                method = dataclasses.replace(base, name=f"{base.name}-{width}")
                rows.append(row(w, i, method.name, runner.run(p, method, 64)))
panel_kernel.set_isa(library, "avx512")
for name in ("vanilla", "costaware"):
    report(rows, f"{name}-avx512", f"{name}-avx2", out)
