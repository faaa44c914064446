"""What the copy pointer adds to costaware, replayed: costaware over its default arms with and
without ``copy``, the copy pointer's n-gram 1 / 2 / 3, and, beside it, the default arms less
``rest`` or less ``eagle`` (decode speed over plain decoding, the verify-cost surface given;
traces as ``banditspec replay`` records them, cached).

    .venv/bin/python experiments/copy_pointer_study.py OUT.md [replay options: --prompts 40
        [--skip 40] | --prompts-file F] --surface docs/benchmarks/engine/surface-xeon-avx512/engine_surface.json
"""

import argparse
import sys
from pathlib import Path

from banditspec.drafters.copy_pointer import CopyPointerDrafter
from banditspec.evaluation.replay import record_proposals, replay_policy
from banditspec_client import replay as R

ARMS = ["pld", "suffix", "rest", "eagle"]
VARIANTS = (  # label, copy pointer's n-gram (None: no copy arm), arms left out
    ("costaware without copy (before)", None, ()),
    ("costaware with copy, n-gram 2 (default)", 2, ()),
    ("n-gram 1", 1, ()),
    ("n-gram 3", 3, ()),
    ("with copy, without rest", 2, ("rest",)),
    ("with copy, without eagle", 2, ("eagle",)),
)

out = sys.argv[1]
parser = argparse.ArgumentParser()
R.add_arguments(parser)
args = parser.parse_args(["--drafters", ",".join(ARMS), "--costs", "surface", *sys.argv[2:]])
traces, tokenizer = R.record(args, R._prompts(args))
eos = int(tokenizer.eos_token_id)
platform = R._surface_model(17, args.surface)
one = float(platform.curve()[1])
call, token, _ = R.parse_eagle_cost(args.eagle_cost)
costly = {"eagle": (call * one, token * one)}
kinds = sorted({t.kind for t in traces})
plain = replay_policy(traces, "vanilla", ARMS, platform, max_draft_len=args.max_draft_len, eos_id=eos,
                      costly=costly)["rows"]
lines = [f"Replay over {len(traces)} prompts ({', '.join(kinds)}), {args.max_tokens} tokens max, L = "
         f"{args.max_draft_len}, surface {args.surface}: costaware's decode speed over plain decoding.", "",
         "| arms | " + " | ".join(kinds) + " | all |", "|---|" + "---:|" * (len(kinds) + 1)]
for label, ngram, without in VARIANTS:
    arms = [a for a in ARMS if a not in without]
    if ngram is not None:
        drafter = CopyPointerDrafter(ngram=ngram)
        for trace in traces:
            record_proposals(trace, {"copy": drafter}, args.record_len)
        arms.append("copy")
    rows = replay_policy(traces, "costaware", arms, platform, max_draft_len=args.max_draft_len, eos_id=eos,
                         costly=costly)["rows"]
    assert all(r["identical"] for r in rows)
    speeds = []
    for kind in (*kinds, "all"):
        idx = [i for i, t in enumerate(traces) if kind in ("all", t.kind)]
        speeds.append(sum(plain[i]["seconds"] for i in idx) / sum(rows[i]["seconds"] for i in idx))
    lines.append(f"| {label} | " + " | ".join(f"{s:.3f}x" for s in speeds) + " |")
    print(lines[-1], flush=True)
Path(out).parent.mkdir(parents=True, exist_ok=True)
with open(out, "w") as f:
    f.write("\n".join(lines) + "\n\nEvery replayed output identical to plain decoding.\n")
