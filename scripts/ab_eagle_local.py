"""Wall clock A/B through Triton: costaware with the Eagle head in the `eagle` model over BLS
(eagle_model "eagle", the default) against the head inside the controller model
(eagle_model ""), the two interleaved per prompt (order alternating), every output compared.
SmolLM2-135M fp32, 1 torch thread, 64 tokens, default settings otherwise.

    .venv/bin/python scripts/ab_eagle_local.py PROMPTS_PER_WORKLOAD SEED OUT.json
"""

import dataclasses
import json
import sys

from banditspec_client import serve
from banditspec_client.bench import through_triton
from banditspec_client.bench.methods import parse_methods
from banditspec_client.bench.runner import RunSettings
from banditspec_client.bench.workloads import load_workload

n, seed, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
base = parse_methods("costaware")[0]
methods = [dataclasses.replace(base, name="remote"), dataclasses.replace(base, name="local")]
EAGLE_MODEL = {"remote": "eagle", "local": ""}


class Runner(through_triton.TritonRunner):
    """Serves each method from its own controller copy; sets each copy's eagle_model."""

    def __enter__(self):
        original = serve.TritonServer

        def server(**kwargs):
            for m in methods:
                kwargs["overrides"][through_triton.private_model_name(m)]["eagle_model"] = EAGLE_MODEL[m.name]
            return original(**kwargs)

        serve.TritonServer = server
        try:
            return super().__enter__()
        finally:
            serve.TritonServer = original


rows = []
with Runner(RunSettings(threads=1), methods) as runner:
    for w in ("code", "code-edit", "chat", "mixed"):
        for i, p in enumerate(load_workload(w, n, seed=seed)):
            for m in (methods if i % 2 == 0 else methods[::-1]):
                r = runner.run(p, m, 64)
                rest = [s - v for s, v in zip(r.step_ms[1:], r.verify_ms[1:])]
                rows.append((w, i, m.name, r.generated_tokens, r.seconds, sum(r.step_ms[1:]) / 1000, sum(rest), len(rest),
                             r.output_digest))
with open(out, "w") as f:
    json.dump({"columns": ["workload", "prompt", "method", "tokens", "seconds", "decode_seconds",
                           "rest_of_steps_ms", "decode_steps", "digest"], "rows": rows}, f)
for w in ("code", "code-edit", "chat", "mixed", "all"):
    agg = {}
    for m in ("remote", "local"):
        rs = [r for r in rows if (w == "all" or r[0] == w) and r[2] == m]
        agg[m] = (sum(r[3] for r in rs) / sum(r[4] for r in rs), sum(r[6] for r in rs) / sum(r[7] for r in rs),
                  sum(r[3] for r in rs) / sum(r[5] for r in rs))
    same = all(len({r[8] for r in rows if r[0] == ww and r[1] == i}) == 1 for ww, i in {(r[0], r[1]) for r in rows})
    print(f"{w:10s} local/remote tokens/s {agg['local'][0] / agg['remote'][0]:.3f}  decode "
          f"{agg['local'][2] / agg['remote'][2]:.3f}  rest ms/step {agg['local'][1]:.2f} vs {agg['remote'][1]:.2f}  identical {same}")
