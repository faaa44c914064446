"""Choose the Eagle drafter's ``min_confidence``: acceptance and predicted speed per threshold.

For held-out chat and code prompts the target decodes greedily once; the speculative loop at
gamma = L is then replayed (as in bench_eagle.py) for each threshold, counting accepted and
proposed tokens per step. The cost of a step is measured on the serving engine: one verify
of 1 + d tokens over a cached prompt (d = 0..L drafts, interleaved, median), plus the head's
cost per draft step. Predicted tokens/s = tokens / sum over steps of (verify(d) + draft
steps x draft cost), reported against plain decoding (verify(0) per token).

    .venv/bin/python experiments/eagle/tune_confidence.py [--chat 10 --code 10]
        [--thresholds 0,0.1,0.2,0.3,0.4,0.5] [--out docs/eagle/confidence.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from banditspec.drafters.eagle import DEFAULT_WEIGHTS, EagleDrafter, load_default_eagle_drafter
from banditspec.paths import REPO_ROOT
from banditspec.text import prompt_ids
from banditspec_train.eagle.evaluate import greedy_speculative, simulate_acceptance, step_costs, target_features
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_eagle import chat_prompts, code_prompts  # noqa: E402


def verify_costs(model, prompt: list[int], max_drafts: int, repeats: int = 15) -> list[float]:
    """Median seconds of one verify step of 1 + d tokens over the cached prompt, d = 0..max_drafts,
    on the serving engine (ReferenceEngine, default kernels; its prefix cache holds the prompt)."""
    from banditspec.engine.contract import VerifyRequest
    from banditspec.engine.reference import ReferenceEngine

    engine = ReferenceEngine(model, max_context=2048)
    ids = np.asarray(prompt, dtype=np.int32)
    engine.verify([VerifyRequest(ids)])
    times: list[list[float]] = [[] for _ in range(max_drafts + 1)]
    for _ in range(repeats):
        for d in range(max_drafts + 1):  # interleaved: drift hits every d alike
            t0 = time.perf_counter()
            engine.verify([VerifyRequest(ids, np.full(d, 5, dtype=np.int32))])
            times[d].append(time.perf_counter() - t0)
    return [float(np.median(t)) for t in times]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--chat", type=int, default=10)
    parser.add_argument("--code", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--thresholds", default="0,0.1,0.2,0.3,0.4,0.5")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--weights", type=Path, default=DEFAULT_WEIGHTS)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "docs" / "eagle" / "confidence.json")
    args = parser.parse_args()
    thresholds = [float(x) for x in args.thresholds.split(",")]

    from banditspec.engine.models import load_model

    torch.set_num_threads(args.threads)
    model, tokenizer = load_model("smollm2")
    base = load_default_eagle_drafter(model, args.weights, min_confidence=0.0)
    drafters = {t: EagleDrafter(base.head, base.embedding, stop_ids=base.stop_ids, min_confidence=t) for t in thresholds}
    eos = tokenizer.eos_token_id
    probe = None
    steps: dict[str, dict[float, list[tuple[int, int]]]] = {}
    for workload, prompts in (("chat", chat_prompts(args.chat)), ("code", code_prompts(args.code))):
        steps[workload] = {t: [] for t in thresholds}
        for text in tqdm(prompts, desc=workload, unit="prompt"):
            ids = prompt_ids(tokenizer, text, chat=True)  # as the server builds it
            probe = probe or ids
            plain = greedy_speculative(model, base, ids, 0, args.max_new_tokens, eos).output_ids
            hidden = target_features(model, ids + plain, base)
            for t, drafter in drafters.items():
                stats = simulate_acceptance(drafter, ids, plain, hidden, args.gamma)
                steps[workload][t].extend(zip(stats.accepted, stats.proposed))
    verify = verify_costs(model, probe, args.gamma)
    draft_step = step_costs(model, base, probe)["draft_step_s"]
    report = {"gamma": args.gamma, "threads": args.threads, "verify_s_by_drafts": [round(v, 5) for v in verify],
              "draft_step_s": round(draft_step, 5), "workloads": {}}
    for workload, per_threshold in steps.items():
        rows = {}
        for t, pairs in per_threshold.items():
            tokens = sum(a + 1 for a, _ in pairs)
            # a draft stopped by the threshold evaluated one more head step than it proposed
            seconds = sum(verify[d] + draft_step * min(d + (t > 0), args.gamma) for _, d in pairs)
            rows[str(t)] = {
                "mean_accepted_tokens": round(tokens / len(pairs), 3),
                "mean_drafted": round(sum(d for _, d in pairs) / len(pairs), 3),
                "predicted_speedup_over_plain": round((tokens / seconds) / (1 / verify[0]), 3),
            }
        report["workloads"][workload] = rows
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
