"""Acceptance and draft-step cost of the shipped Eagle head on SmolLM2-135M-Instruct.

For each prompt (ShareGPT EVAL-split first turns, HumanEval prompts; neither is in the
training text) the target decodes greedily once; the speculative loop at every gamma is then
replayed from that output (greedy output does not depend on the drafter) with the target's
hidden states of one forward pass. A real speculative loop at the largest gamma checks, on
the first prompts, that its output equals plain greedy decoding.

    .venv/bin/python experiments/eagle/bench_eagle.py [--chat 10 --code 10 --max-new-tokens 96]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from banditspec.drafters.eagle import DEFAULT_INT8, DEFAULT_WEIGHTS, load_default_eagle_drafter
from banditspec.paths import REPO_ROOT
from banditspec.text import prompt_ids
from banditspec_train.eagle.evaluate import greedy_speculative, simulate_acceptance, step_costs, target_features


def chat_prompts(n: int, skip: int = 0) -> list[str]:
    """First turns of ShareGPT eval-split conversations (20-600 characters), after ``skip`` of them."""
    from banditspec.datasets import sharegpt_split

    out: list[str] = []
    for conversation in sharegpt_split("eval"):
        role, text = conversation[0]
        if role == "human" and 20 <= len(text) <= 600:
            out.append(text)
        if len(out) == skip + n:
            break
    return out[skip:]


def code_prompts(n: int, skip: int = 0) -> list[str]:
    from banditspec.datasets import humaneval_problems

    problems = humaneval_problems()[skip:skip + n]
    return [f"Complete the following Python function.\n\n```python\n{p['prompt']}```" for p in problems]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--weights", type=Path, default=DEFAULT_WEIGHTS)
    parser.add_argument("--chat", type=int, default=10)
    parser.add_argument("--code", type=int, default=10)
    parser.add_argument("--skip", type=int, default=0,
                        help="leave out the first prompts of each workload (another held-out set)")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--gammas", type=int, nargs="+", default=[1, 2, 3, 4])
    parser.add_argument("--check-prompts", type=int, default=2, help="prompts run through the real loop")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--precision", choices=("int8", "fp32"), default="int8" if DEFAULT_INT8 else "fp32",
                        help="the head's weights while drafting (default: what serving uses)")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "docs" / "eagle" / "acceptance.json")
    args = parser.parse_args()

    from banditspec.engine.models import load_model

    torch.set_num_threads(args.threads)
    model, tokenizer = load_model("smollm2")
    # the head itself: full-length drafts
    drafter = load_default_eagle_drafter(model, args.weights, min_confidence=0.0, int8=args.precision == "int8")
    in_vocab = set(drafter.draft_vocab.tolist())
    eos = tokenizer.eos_token_id
    report: dict = {"weights": args.weights.name, "precision": args.precision, "max_new_tokens": args.max_new_tokens,
                    "skip": args.skip, "workloads": {}}
    for workload, prompts in (("chat", chat_prompts(args.chat, args.skip)), ("code", code_prompts(args.code, args.skip))):
        if not prompts:
            continue
        per_gamma: dict[int, list[int]] = {g: [] for g in args.gammas}
        per_prompt: dict[int, list[float]] = {g: [] for g in args.gammas}  # each prompt's own mean
        steps = {g: 0 for g in args.gammas}
        covered, generated, mismatches = 0, 0, 0
        started = time.time()
        for index, text in enumerate(prompts):
            ids = prompt_ids(tokenizer, text, chat=True)  # as the server builds it
            plain = greedy_speculative(model, drafter, ids, 0, args.max_new_tokens, eos).output_ids
            hidden = target_features(model, ids + plain, drafter)
            for g in args.gammas:
                stats = simulate_acceptance(drafter, ids, plain, hidden, g)
                per_gamma[g].extend(stats.accepted)
                per_prompt[g].append(round(float(np.mean(stats.accepted)) + 1, 3) if stats.accepted else 1.0)
                steps[g] += len(stats.accepted)
            covered += sum(t in in_vocab for t in plain)
            generated += len(plain)
            if index < args.check_prompts:
                real = greedy_speculative(model, drafter, ids, max(args.gammas), args.max_new_tokens, eos)
                mismatches += real.output_ids != plain
        report["workloads"][workload] = {
            "prompts": len(prompts),
            "generated_tokens": generated,
            "target_tokens_in_draft_vocab": round(covered / max(1, generated), 4),
            "mean_accepted_tokens": {g: round(float(np.mean(per_gamma[g])) + 1, 3) for g in args.gammas},
            "draft_steps": steps,
            "mean_accepted_tokens_per_prompt": per_prompt,
            "real_loop_output_mismatches": mismatches,
            "seconds": round(time.time() - started, 1),
        }
        print(workload, json.dumps(report["workloads"][workload]), flush=True)
    costs = step_costs(model, drafter, prompt_ids(tokenizer, chat_prompts(1)[0], chat=True))
    report["step_costs"] = {k: round(v, 5) for k, v in costs.items()}
    report["threads"] = args.threads
    print("costs", json.dumps(report["step_costs"]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
