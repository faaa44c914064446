"""Wall clock A/B in process: costaware with Eagle previewed every round (previews) against
Eagle pulled blind (the default), the two interleaved per prompt (order alternating), every
output compared. SmolLM2-135M fp32, 1 torch thread, 64 tokens, default settings otherwise.

    .venv/bin/python scripts/ab_previews.py PROMPTS_PER_WORKLOAD SEED OUT.json
"""

import dataclasses
import json
import sys

import torch
from tqdm import tqdm

from banditspec_client.bench.in_process import InProcessRunner
from banditspec_client.bench.methods import parse_methods
from banditspec_client.bench.runner import RunSettings
from banditspec_client.bench.workloads import load_workload

torch.set_num_threads(1)
n, seed, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
base = parse_methods("costaware")[0]
methods = [dataclasses.replace(base, name="previews"), dataclasses.replace(base, name="blind")]
runner = InProcessRunner(RunSettings())
eagle = runner.shared_drafters["eagle"]
default = eagle.previews
workloads = ("code", "code-edit", "chat", "mixed")
rows = []
with tqdm(total=len(workloads) * n * 2) as bar:
    for w in workloads:
        for i, p in enumerate(load_workload(w, n, seed=seed)):
            for m in (methods if i % 2 == 0 else methods[::-1]):
                eagle.previews = m.name == "previews"
                r = runner.run(p, m, 64)
                rest = [s - v for s, v in zip(r.step_ms[1:], r.verify_ms[1:])]
                rows.append((w, i, m.name, r.generated_tokens, r.seconds, sum(r.step_ms[1:]) / 1000, sum(rest), len(rest),
                             r.output_digest))
                bar.update()
eagle.previews = default
with open(out, "w") as f:
    json.dump({"columns": ["workload", "prompt", "method", "tokens", "seconds", "decode_seconds",
                           "rest_of_steps_ms", "decode_steps", "digest"], "rows": rows}, f)
for w in (*workloads, "all"):
    agg = {}
    for m in ("previews", "blind"):
        rs = [r for r in rows if (w == "all" or r[0] == w) and r[2] == m]
        agg[m] = (sum(r[3] for r in rs) / sum(r[4] for r in rs), sum(r[6] for r in rs) / sum(r[7] for r in rs),
                  sum(r[3] for r in rs) / sum(r[5] for r in rs))
    same = all(len({r[8] for r in rows if r[0] == ww and r[1] == i}) == 1 for ww, i in {(r[0], r[1]) for r in rows})
    print(f"{w:10s} previews/blind tokens/s {agg['previews'][0] / agg['blind'][0]:.3f}  decode "
          f"{agg['previews'][2] / agg['blind'][2]:.3f}  rest ms/step {agg['previews'][1]:.2f} vs {agg['blind'][1]:.2f}  identical {same}")
