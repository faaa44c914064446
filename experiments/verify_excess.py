"""How much longer METHOD's target calls take than a fixed arm's at the same draft length,
from a ``banditspec bench`` run: each of METHOD's decode steps is paired with the other
method's step on the same prompt, at the same draft length, nearest in generated tokens
(within WINDOW; prompt and context length then match, the verify cost's two other
variables). A step's verify time is what the controller waits on the target call
(``verify_ms``), so an excess there is not the controller's own arithmetic.

    .venv/bin/python experiments/verify_excess.py RESULTS.json [METHOD [OTHER,METHODS [WINDOW]]]
"""

import collections
import json
import statistics
import sys
from pathlib import Path

path = sys.argv[1]
method = sys.argv[2] if len(sys.argv) > 2 else "costaware"
others = sys.argv[3].split(",") if len(sys.argv) > 3 else ["suffix", "copy", "vanilla"]
window = int(sys.argv[4]) if len(sys.argv) > 4 else 8
# (prompt, method, drafted) -> [(tokens generated before the step, verify ms)]
steps: dict[tuple[str, str, int], list[tuple[int, float]]] = collections.defaultdict(list)
for record in json.loads(Path(path).read_text())["records"]:
    generated = 1  # the first step (the prefill) emits one token and is left out
    for verify, drafted, accepted in list(zip(record["verify_ms"], record["drafted"], record["accepted"]))[1:]:
        steps[(record["prompt_id"], record["method"], drafted)].append((generated, verify))
        generated += accepted + 1

print(f"{method}'s verify minus the other method's, same prompt and draft length, within {window} tokens")
print("| other | drafted | pairs | mean ms | median ms |")
print("|---|---:|---:|---:|---:|")
for other in others:
    for drafted in sorted({d for (_, m, d) in steps if m == method}):
        diffs = []
        for (prompt, m, d), mine in steps.items():
            theirs = steps.get((prompt, other, drafted))
            if m != method or d != drafted or not theirs:
                continue
            for generated, verify in mine:
                near, their_verify = min(theirs, key=lambda step: abs(step[0] - generated))
                if abs(near - generated) <= window:
                    diffs.append(verify - their_verify)
        if len(diffs) >= 20:
            print(f"| {other} | {drafted} | {len(diffs)} | {statistics.fmean(diffs):.2f} | {statistics.median(diffs):.2f} |")
