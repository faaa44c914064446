"""What a tree of the Eagle head's top-k drafts would accept, and what it would cost here.

EAGLE-2 drafts a tree instead of a chain: at each depth it expands the ``beam`` most probable
nodes (probability of a node = the product of the head's probabilities along its path) into
their ``top-k`` children, then keeps the N most probable nodes of all it made; the target
verifies the whole tree in one forward (each node attending to its ancestors) and the
longest path matching its own tokens is accepted. The engine here verifies chains only, so
this study replays it offline, as bench_eagle.py replays chains: greedy output does not
depend on the drafter, so for each prompt the target decodes once and every policy is
replayed from that output with the target's features (the head's session advances by what
each step would have accepted).

Policies (rows of the table):

* ``chain@4``: the served drafting, full length (no cut-off): the issue's MAT at gamma 4;
* ``tree N@D``: the N most probable nodes of a depth-D tree (top-k ``k``, beam ``b``);
* ``chain, cost-aware`` / ``tree, cost-aware``: per step, the prefix of the chain (or the set
  of the tree's most probable nodes) that maximises expected tokens per unit of cost, the
  head's path probabilities taken as acceptance probabilities (expected tokens of a tree =
  1 + the sum of its nodes' path probabilities) and the cost = a verify of 1 + nodes tokens
  at the step's context on the measured surface (``--surface``, the replay's fitted model)
  plus ``--level-cost`` (chain) or ``--tree-level-cost`` (tree) per depth drafted, in
  units of a one-token verify.

Reported per workload: MAT (mean accepted + 1 per step), mean nodes verified per step, and
the predicted speed-up over plain decoding = tokens / sum of the steps' relative costs
(the same costs; plain decoding costs 1 per token). Predictions, not wall clock: the replay
of chains has run ~15-20 % optimistic against the loop (README, "Confidence cut-off").

    .venv/bin/python experiments/eagle/tree_study.py [--chat 12 --code 12] [--weights eagle1|eagle3]
        [--out docs/eagle/tree-study.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from banditspec.bandits.cost_model import CostModel
from banditspec.drafters.eagle import HEADS, EagleSession, load_default_eagle_drafter
from banditspec.eagle.fast_step import KVBuffer
from banditspec.paths import REPO_ROOT
from banditspec.text import prompt_ids
from banditspec_train.eagle.evaluate import greedy_speculative, target_features
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_eagle import chat_prompts, code_prompts  # noqa: E402

# A verify surface with k up to 17 (1 + the largest tree):
#     banditspec bench-engine --kernels fast --threads 1 --contexts 64,300,700,1024,1536 --ks 1,2,...,17 --out DIR


@dataclass(frozen=True)
class Policy:
    name: str
    top_k: int  # children per expanded node
    beam: int  # nodes expanded per depth
    depth: int
    nodes: int  # nodes kept (fixed policies); the most a cost-aware one may keep
    cost_aware: bool = False


POLICIES = [
    Policy("chain@4", 1, 1, 4, 4),
    Policy("tree 6@4", 2, 2, 4, 6),
    Policy("tree 8@4", 3, 3, 4, 8),
    Policy("tree 12@4", 3, 4, 4, 12),
    Policy("tree 16@4", 4, 4, 4, 16),
    Policy("chain, cost-aware", 1, 1, 8, 8, True),
    Policy("tree, cost-aware", 4, 4, 6, 16, True),
]


@dataclass
class Node:
    probability: float  # product of the head's probabilities along the path
    token: int
    depth: int
    parent: int  # index of the parent node; -1: the root (the last verified token)


def _clone(cache: KVBuffer) -> KVBuffer:
    copy = KVBuffer.__new__(KVBuffer)
    copy.k, copy.v, copy.length = cache.k.clone(), cache.v.clone(), cache.length
    return copy


def draft_tree(session: EagleSession, policy: Policy, depth: int) -> list[Node]:
    """Every node the expansion makes (beam x top-k per depth), most probable first within a depth."""
    drafter = session.drafter
    frontier = [(-1, session._commit_pending(), _clone(session.cache), 1.0)]  # (node, f^, cache, prob)
    nodes: list[Node] = []
    for level in range(depth):
        made = []
        for parent, predicted, cache, probability in frontier:
            probs = torch.softmax(drafter.logits(predicted).float(), dim=-1)
            top = torch.topk(probs, policy.top_k)
            for p, index in zip(top.values.tolist(), top.indices.tolist()):
                nodes.append(Node(probability * p, int(drafter.draft_vocab[index]), level + 1, parent))
                made.append((len(nodes) - 1, predicted, cache))
        if level + 1 == depth:
            break
        frontier = []
        for index, predicted, cache in sorted(made, key=lambda m: -nodes[m[0]].probability)[: policy.beam]:
            grown = _clone(cache)
            embedding = drafter.embedding[nodes[index].token].view(1, 1, -1)
            frontier.append((index, drafter.step(embedding, predicted, grown)[:, -1:], grown, nodes[index].probability))
    return nodes


def by_probability(nodes: list[Node]) -> list[int]:
    return sorted(range(len(nodes)), key=lambda i: -nodes[i].probability)


def most_probable(nodes: list[Node], n: int, order: list[int] | None = None) -> list[int]:
    """Indices of the n most probable nodes (a child is never more probable than its parent,
    so the set is a tree; ancestors are added should a tie break that). ``order``: the
    nodes' :func:`by_probability`, when the caller has it."""
    chosen = set((by_probability(nodes) if order is None else order)[:n])
    for i in list(chosen):
        parent = nodes[i].parent
        while parent >= 0 and parent not in chosen:
            chosen.add(parent)
            parent = nodes[parent].parent
    return sorted(chosen)


def accepted(nodes: list[Node], chosen: list[int], target: list[int]) -> int:
    children: dict[int, dict[int, int]] = {}
    for i in chosen:
        children.setdefault(nodes[i].parent, {})[nodes[i].token] = i
    at, length = -1, 0
    while length < len(target) and target[length] in children.get(at, {}):
        at = children[at][target[length]]
        length += 1
    return length


def step_cost(costs: CostModel, context: int, chosen: list[int], nodes: list[Node], level_cost: float) -> float:
    """A step's cost in one-token verifies: the verify of 1 + len(chosen) tokens, plus the head's levels."""
    depth = max((nodes[i].depth for i in chosen), default=0)
    return costs.verify_seconds(1 + len(chosen), context) / costs.verify_seconds(1, context) + depth * level_cost


def choose(policy: Policy, nodes: list[Node], costs: CostModel, context: int, level_cost: float) -> list[int]:
    if not policy.cost_aware:
        return most_probable(nodes, policy.nodes)
    order = by_probability(nodes)
    best, best_value, expected = [], 1.0 / step_cost(costs, context, [], nodes, level_cost), 1.0
    for n in range(1, min(policy.nodes, len(order)) + 1):
        expected += nodes[order[n - 1]].probability
        chosen = most_probable(nodes, n, order)
        value = expected / step_cost(costs, context, chosen, nodes, level_cost)
        if value > best_value:
            best, best_value = chosen, value
    return best


def replay(drafter, policy: Policy, prompt: list[int], output: list[int], hidden: np.ndarray, costs: CostModel,
           level_cost: float) -> tuple[list[int], list[int], float]:
    """(accepted per step, nodes per step, summed relative cost) of ``policy`` over one prompt."""
    total = prompt + output
    session = drafter.start(prompt)
    position = len(prompt)
    session.observe([total[position]], hidden[:position])
    position += 1
    accepted_lengths, sizes, cost = [], [], 0.0
    while position < len(total):
        depth = min(policy.depth, len(total) - position)
        nodes = draft_tree(session, policy, depth)
        chosen = choose(policy, nodes, costs, position, level_cost)
        length = accepted(nodes, chosen, total[position: position + depth])
        accepted_lengths.append(length)
        sizes.append(len(chosen))
        cost += step_cost(costs, position, chosen, nodes, level_cost)
        new = total[position: position + length + 1]
        session.observe(new, hidden[position - 1: position - 1 + len(new)])
        position += len(new)
    session.close(finished=True)
    return accepted_lengths, sizes, cost


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for workload, rows in report["workloads"].items():
        fixed = [r for r in rows if not r["cost_aware"]]
        axes[0].plot([r["nodes_per_step"] for r in fixed], [r["mat"] for r in fixed], "o-", label=workload)
        axes[1].plot([r["nodes_per_step"] for r in rows], [r["predicted_speedup"] for r in rows], "o", label=workload)
        for r in rows:
            axes[1].annotate(r["policy"], (r["nodes_per_step"], r["predicted_speedup"]), fontsize=6)
    axes[0].axhline(2.0, color="grey", lw=0.8, ls="--")
    axes[0].set(xlabel="nodes verified per step", ylabel="mean accepted tokens per step", title="acceptance (depth 4)")
    axes[1].set(xlabel="nodes verified per step", ylabel="predicted speed-up over plain", title="priced on the surface")
    for ax in axes:
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--weights", choices=sorted(HEADS), default="eagle1")
    parser.add_argument("--chat", type=int, default=12)
    parser.add_argument("--code", type=int, default=12)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--surface", type=Path, required=True, help="bench-engine's engine_surface.json, k up to 17")
    parser.add_argument("--level-cost", type=float, default=0.03,
                        help="a chain's head cost per drafted token, in one-token verifies (README: ~2 ms / ~60 ms)")
    parser.add_argument("--tree-level-cost", type=float, default=0.06,
                        help="a tree level's head cost (beam nodes in one batched head call and their LM-head rows)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "docs" / "eagle" / "tree-study.json")
    args = parser.parse_args()

    from banditspec.engine.models import load_model

    torch.set_num_threads(args.threads)
    model, tokenizer = load_model("smollm2")
    drafter = load_default_eagle_drafter(model, HEADS[args.weights], min_confidence=0.0)
    surface = json.loads(args.surface.read_text())
    costs = CostModel.from_table({int(c): {int(k): ms / 1000 for k, ms in row.items()}
                                  for c, row in surface["verify_ms"].items()})
    eos = tokenizer.eos_token_id
    surface_name = args.surface.resolve()
    if surface_name.is_relative_to(REPO_ROOT):
        surface_name = surface_name.relative_to(REPO_ROOT)
    report: dict = {"weights": args.weights, "max_new_tokens": args.max_new_tokens, "surface": str(surface_name),
                    "level_cost": args.level_cost, "tree_level_cost": args.tree_level_cost, "threads": args.threads,
                    "policies": [p.__dict__ for p in POLICIES], "workloads": {}}
    started = time.time()
    for workload, prompts in (("chat", chat_prompts(args.chat)), ("code", code_prompts(args.code))):
        if not prompts:
            continue
        per_policy: dict[str, tuple[list[int], list[int], float]] = {p.name: ([], [], 0.0) for p in POLICIES}
        tokens = 0
        for text in tqdm(prompts, desc=workload):
            ids = prompt_ids(tokenizer, text, chat=True)  # as the server builds it
            with torch.inference_mode():
                plain = greedy_speculative(model, drafter, ids, 0, args.max_new_tokens, eos).output_ids
                hidden = target_features(model, ids + plain, drafter)
                for policy in POLICIES:
                    level = args.tree_level_cost if policy.beam > 1 else args.level_cost
                    a, n, c = replay(drafter, policy, list(ids), list(plain), hidden, costs, level)
                    acc, sizes, cost = per_policy[policy.name]
                    per_policy[policy.name] = (acc + a, sizes + n, cost + c)
            tokens += len(plain)
        rows = []
        for policy in POLICIES:
            acc, sizes, cost = per_policy[policy.name]
            rows.append({"policy": policy.name, "cost_aware": policy.cost_aware, "steps": len(acc),
                         "mat": round(float(np.mean(acc)) + 1, 3), "nodes_per_step": round(float(np.mean(sizes)), 2),
                         "predicted_speedup": round(tokens / cost, 3)})
        report["workloads"][workload] = rows
        print(workload, json.dumps(rows), flush=True)
    report["seconds"] = round(time.time() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    plot(report, args.out.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
