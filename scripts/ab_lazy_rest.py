"""Wall clock A/B in process: costaware with REST asked lazily (the default) against REST
asked every round, the two interleaved per prompt (order alternating), every output compared.
SmolLM2-135M fp32, 1 torch thread, 64 tokens, default settings otherwise.

    .venv/bin/python scripts/ab_lazy_rest.py PROMPTS_PER_WORKLOAD SEED OUT.json
"""

import dataclasses
import json
import sys

import torch

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
rows = []
for w in ("code", "code-edit", "chat", "mixed"):
    for i, p in enumerate(load_workload(w, n, seed=seed)):
        order = methods if i % 2 == 0 else methods[::-1]
        for m in order:
            RestDrafter.proposes_lazily = m.name == "lazy"
            r = runner.run(p, m, 64)
            rest = [s - v for s, v in zip(r.step_ms[1:], r.verify_ms[1:])]
            rows.append((w, i, m.name, r.generated_tokens, r.seconds, sum(r.step_ms[1:]) / 1000, sum(rest), len(rest), r.output_digest))
RestDrafter.proposes_lazily = True
with open(out, "w") as f:
    json.dump({"columns": ["workload", "prompt", "method", "tokens", "seconds", "decode_seconds",
                           "rest_of_steps_ms", "decode_steps", "digest"], "rows": rows}, f)
for w in ("code", "code-edit", "chat", "mixed", "all"):
    agg = {}
    for m in ("lazy", "eager"):
        rs = [r for r in rows if (w == "all" or r[0] == w) and r[2] == m]
        agg[m] = (sum(r[3] for r in rs) / sum(r[4] for r in rs), sum(r[6] for r in rs) / sum(r[7] for r in rs),
                  sum(r[3] for r in rs) / sum(r[5] for r in rs))
    same = all(len({r[8] for r in rows if r[0] == ww and r[1] == i}) == 1 for ww, i in {(r[0], r[1]) for r in rows})
    print(f"{w:10s} lazy/eager tokens/s {agg['lazy'][0]/agg['eager'][0]:.3f}  decode {agg['lazy'][2]/agg['eager'][2]:.3f}  rest ms/step {agg['lazy'][1]:.2f} vs {agg['eager'][1]:.2f}  identical {same}")
