"""What Eagle previews would be worth at other preview costs: the replay, over many prompts.

costaware replayed (``banditspec.evaluation.replay``, the measured verify-cost surface) over the same
recorded traces with: Eagle blind (the default), no Eagle, and Eagle previewed every round at
a sweep of preview costs (a previewed pull costs only its drafting, the catch-up being the
preview's). Costs are in units of a one-token verify. Prompts, recording and cache are
``banditspec replay``'s (same options); prints a markdown table of tokens/s relative to blind.

    .venv/bin/python experiments/eagle/replay_previews.py --workloads code,code-edit,chat --prompts 40 \\
        --max-tokens 64 --drafters pld,suffix,rest,eagle
"""

from __future__ import annotations

import argparse
import collections
import sys

PREVIEWED = (0.01, 0.05)  # per call after a preview (drafting only), per drafted token
PREVIEW_COSTS = (0.07, 0.035, 0.015, 0.0)  # 0.07: what a preview costs in process today (~4 ms)


def main() -> int:
    from banditspec.evaluation.replay import replay_policy
    from banditspec_client.replay import EAGLE_COST, _prompts, _surface_model, add_arguments, parse_eagle_cost, record

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args()
    traces, tokenizer = record(args, _prompts(args))
    eos = int(tokenizer.eos_token_id)
    platform = _surface_model(17)
    one = float(platform.curve()[1])
    drafters = [d.strip() for d in args.drafters.split(",") if d.strip()]
    if "eagle" not in drafters:
        print("--drafters must include eagle")
        return 1
    blind = parse_eagle_cost(EAGLE_COST)[:2]  # measured: per call (its catch-up included), per drafted token
    configs = [("Eagle blind (default)", blind, None), ("no Eagle", None, None)]
    configs += [(f"previews at {p:g}", PREVIEWED, p) for p in PREVIEW_COSTS]
    kinds = sorted({t.kind for t in traces})
    rates: dict[str, dict[str, tuple[float, float]]] = {}
    for label, cost, preview in configs:
        arms = [d for d in drafters if cost is not None or d != "eagle"]
        rows = replay_policy(traces, "costaware", arms, platform, max_draft_len=args.max_draft_len, eos_id=eos,
                             costly={} if cost is None else {"eagle": (cost[0] * one, cost[1] * one)},
                             preview_seconds=None if preview is None else {"eagle": preview * one})["rows"]
        if not all(r["identical"] for r in rows):
            print(f"{label}: a replayed output differs from plain decoding")
            return 1
        sums: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
        for r in rows:
            for key in (r["kind"], "all"):
                s = sums[key]
                s[0] += r["seconds"]
                s[1] += r["tokens"]
                s[2] += sum(a.startswith("eagle@") for a in r["arms"])
                s[3] += len(r["arms"])
        rates[label] = {k: (s[1] / s[0], s[2] / max(1.0, s[3])) for k, s in sums.items()}
    base = rates[configs[0][0]]
    columns = kinds + ["all"]
    print(f"{len(traces)} prompts, {args.max_tokens} tokens, L = {args.max_draft_len}, surface cost model; "
          f"tokens/s relative to Eagle blind (share of steps Eagle drafted)\n")
    print("| costaware with | " + " | ".join(columns) + " |")
    print("|---|" + "---:|" * len(columns))
    for label in rates:
        cells = [f"{rates[label][k][0] / base[k][0]:.3f} ({rates[label][k][1]:.0%})" for k in columns]
        print(f"| {label} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
