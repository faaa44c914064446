"""Which Eagle head should the default serve to chat traffic? costaware with the EAGLE-3 head as
its ``eagle`` arm against the same with the EAGLE-1 head, on the traffic the head choice is for:
single-turn chat through Triton, and multi-turn conversations through the OpenAI chat API
(turn k sent with turns 1..k-1 and the model's own earlier answers as history), greedy or
sampled. One server per head (``eagle_head`` on the controller copy and on the ``eagle`` model),
both up at once, the heads interleaved per prompt / conversation (order alternating). Prompts
and conversations come from the tune split: this run decides a default.

    .venv/bin/python experiments/ab_eagle_head_chat.py chat N OUT.json [TEMPERATURE [SPLIT]]
    .venv/bin/python experiments/ab_eagle_head_chat.py multiturn N OUT.json [TEMPERATURE [SPLIT]]

SPLIT: tune (default: what decides) or heldout (to confirm a decision on content nobody tuned on).

Every output must match across heads: greedy, both are plain decoding's; sampled (seed 1 on every
request), a seed gives the same text under any drafter.
"""

import dataclasses
import json
import sys
from contextlib import ExitStack

from ab_common import held_out, interleaved, triton_runner
from banditspec.paths import cache_dir
from banditspec_client.bench.methods import parse_methods
from banditspec_client.bench.runner import RunSettings
from tqdm import tqdm

HEADS = ("eagle3", "eagle1")


def tokens_per_second(records, head, turns=None):
    rs = [r for r in records if r["head"] == head and (turns is None or r["turn"] in turns)]
    return sum(r["tokens"] for r in rs) / sum(r["seconds"] for r in rs), len(rs)


def main() -> None:
    mode, n, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    temperature = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
    split = sys.argv[5] if len(sys.argv) > 5 else "tune"
    settings = RunSettings(threads=1, temperature=temperature, seed=1 if temperature > 0 else 0)
    base = parse_methods("costaware")[0]
    methods = [dataclasses.replace(base, name=head) for head in HEADS]
    records: list[dict] = []
    with ExitStack() as stack:
        runners = {}
        for method in methods:
            head = {"eagle_head": method.name}
            Runner = triton_runner([method], lambda m, head=head: head, {"eagle": head})
            log = cache_dir() / f"ab-eagle-head-chat-{method.name}.log"
            if mode == "chat":
                runners[method.name] = stack.enter_context(Runner(settings, [method], log_path=log))
            elif mode == "multiturn":
                from banditspec_client.bench import multiturn

                conversation = multiturn.ConversationRunner(settings, [method], log_path=log)
                conversation.triton = Runner(settings, [method], log_path=log, cache_entries=multiturn.CACHE_ENTRIES)
                runners[method.name] = conversation.__enter__()  # (no __exit__: closed by the stack)
                stack.callback(conversation.close)
            else:
                raise SystemExit(f"mode must be chat or multiturn, got {mode!r}")
        if mode == "chat":
            from banditspec_client.bench.workloads import load_workload

            prompts = held_out(("chat",), n, 0) if split == "tune" else [("chat", load_workload("chat", n, split=split))]
            bar = tqdm(total=n * len(methods), desc="chat")
            runs: list = []  # the RunRecords, in the rows' order (each step's arm)

            def run(prompt, method):
                runs.append(runners[method.name].run(prompt, method, 64))
                return runs[-1]

            rows = interleaved(prompts, methods, run, bar)
            records = [{"item": r[1], "head": r[2], "turn": 1, "tokens": r[3], "seconds": r[4], "digest": r[8],
                        "eagle_steps": sum(a.startswith("eagle") for a in record.arms), "steps": len(record.arms)}
                       for r, record in zip(rows, runs)]
        else:
            from banditspec_client.bench.multiturn import WARMUP
            from banditspec_client.bench.workloads import load_conversations

            for method in methods:
                runners[method.name].run(WARMUP, method, 8)
            conversations = load_conversations(n, turns=3, split=split)
            for index, conversation in enumerate(tqdm(conversations, desc="conversations")):
                for method in (methods if index % 2 == 0 else methods[::-1]):
                    for t in runners[method.name].run(conversation, method, 64):
                        records.append({"item": index, "head": method.name, "turn": t.turn, "tokens": t.generated_tokens,
                                        "seconds": t.seconds, "digest": t.output_digest, "ttft": t.ttft_seconds})
    groups = {"all": None} if mode == "chat" else {"turn 1": (1,), "turns 2-3": (2, 3), "all": None}
    summary = {}
    for label, turns in groups.items():
        (a, count), (b, _) = (tokens_per_second(records, h, turns) for h in HEADS)
        summary[label] = {"eagle3_tok_s": a, "eagle1_tok_s": b, "eagle3_over_eagle1": a / b, "requests_per_head": count}
        print(f"{mode} T={temperature} {label:10s} eagle3 {a:6.1f} tok/s  eagle1 {b:6.1f}  ratio {a / b:.3f}  ({count} a head)")
    if mode == "chat":
        for head in HEADS:
            rs = [r for r in records if r["head"] == head]
            summary[f"{head}_eagle_step_share"] = sum(r["eagle_steps"] for r in rs) / sum(r["steps"] for r in rs)
            print(f"{head}: the eagle arm chosen on {summary[f'{head}_eagle_step_share']:.1%} of the steps")
    same = all(len({r["digest"] for r in records if (r["item"], r["turn"]) == key}) == 1
               for key in {(r["item"], r["turn"]) for r in records})
    print(f"identical outputs across heads: {same}")
    with open(out, "w") as f:
        json.dump({"mode": mode, "temperature": temperature, "split": split, "summary": summary, "identical": same, "records": records}, f, indent=1)


if __name__ == "__main__":
    main()
