"""Pooled figures of a ``banditspec bench`` run over all its workloads (the report has them
per workload): METHOD's tokens/s over plain decoding, over the best fixed arm (re-chosen
in each of 2000 paired-bootstrap resamples of the prompts: a 90 % interval) and over the
per-prompt oracle of the fixed arms; overall and decode only (each request's first step left
out). The fixed arms are every fixed-arm method the run has (pld, suffix, rest, eagle, copy, any
@GAMMA) unless FIXED,ARMS names them; a run lacking an arm the adaptive method may use says so.

    .venv/bin/python experiments/pooled_summary.py RESULTS.json [METHOD [FIXED,ARMS]]
"""

import collections
import json
import random
import sys
from pathlib import Path

from banditspec.config import arm_drafter
from banditspec.drafters.registry import ARM_DRAFTERS

path = sys.argv[1]
method = sys.argv[2] if len(sys.argv) > 2 else "costaware"
FIXED_DRAFTERS = ARM_DRAFTERS  # every arm the default may use
records = json.loads(Path(path).read_text())["records"]
run_fixed = list(dict.fromkeys(r["method"] for r in records if arm_drafter(r["method"]) in FIXED_DRAFTERS))
fixed = sys.argv[3].split(",") if len(sys.argv) > 3 else run_fixed
missing = [d for d in FIXED_DRAFTERS if not any(arm_drafter(f) == d for f in fixed)]
if missing:
    print(f"note: best fixed arm chosen without {', '.join(missing)} (not run or not named), which the default may use")
runs: dict[tuple, dict] = collections.defaultdict(dict)
for r in records:
    runs[(r["workload"], r["prompt_id"])][r["method"]] = r
prompts = sorted(k for k, v in runs.items() if method in v and "vanilla" in v and all(f in v for f in fixed))


def seconds(run: dict, decode: bool) -> float:
    return sum(run["step_ms"][1:]) / 1000 if decode else run["seconds"]


def figures(keys: list, decode: bool) -> tuple[float, str, float, float]:
    def speed(m: str) -> float:
        return sum(runs[k][m]["generated_tokens"] for k in keys) / sum(seconds(runs[k][m], decode) for k in keys)

    best = max(fixed, key=speed)
    oracle = sum(runs[k][method]["generated_tokens"] for k in keys) / sum(
        min(seconds(runs[k][f], decode) for f in fixed) for k in keys)
    return speed(method) / speed(best), best, speed(method) / speed("vanilla"), speed(method) / oracle


for decode in (False, True):
    ratio, best, plain, oracle = figures(prompts, decode)
    rng = random.Random(0)
    resampled = sorted(figures([rng.choice(prompts) for _ in prompts], decode)[0] for _ in range(2000))
    print(f"{len(prompts)} prompts, {'decode only' if decode else 'overall'}: {method} / best fixed ({best}) "
          f"{ratio:.3f} [{resampled[100]:.3f}, {resampled[1899]:.3f}], / plain {plain:.3f}, / per-prompt oracle {oracle:.3f}")
