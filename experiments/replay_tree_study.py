"""Would verifying several drafts at once (a tree) pay? An offline study on replay traces.

The linear verify contract checks one draft per round. A tree verify would check the union
of the cheap drafters' proposals (pld, suffix, rest) in one forward: their chains merged
into a token trie, each node attending to its ancestors only, and the round keeps the
longest path the target accepts. This study prices that with the measured verify-cost
surface (a tree of N nodes costs what a chain of N tokens costs: the same rows) and the
same acceptance tables as ``experiments/replay_feature_study.py`` (costaware's context, fitted
offline with 2-fold cross-fitting).

Choice per round: a node's probability of being on the accepted path is the product of
its drafter's per-position acceptance hazards up to it (the largest over the drafters
proposing it). Children of one node are mutually exclusive, so the expected accepted
length of a tree is the sum of its nodes' probabilities; the round takes the N most
probable nodes (closed under ancestors; N = 0 is plain decoding) that maximise
(1 + that sum) / verify cost(1 + N). The chain row is the feature study's ``base``
policy (one drafter's chain, the same tables).

    .venv/bin/python experiments/replay_tree_study.py --prompts 40 [--skip 40] \\
        --surface SURFACE.json   # banditspec bench-engine --contexts ... --ks 1,...,17
"""

from __future__ import annotations

import numpy as np
import replay_feature_study as S

NODE_CAPS = (8, 12, 16)


def accepted_path(nodes: dict, target: list[int], i: int, n: int) -> int:
    """The longest chosen path (a token tuple) the target's output continues with at ``i``."""
    best = 0
    for path in nodes:
        k = len(path)
        if best < k <= n - 1 - i and list(path) == target[i: i + k]:
            best = k
    return best


def run_tree(traces, tables: dict, surface, max_len: int, max_nodes: int, fit: dict | None = None) -> float:
    """Decode seconds of the tree policy; with ``fit``, count every proposal's outcome into it."""

    def round_of(trace, i, previous, curve):
        nodes: dict[tuple[int, ...], float] = {}
        for _, proposal, top, hazard in S.offers(trace, i, previous, "base", tables, max_len, fit):
            probability = np.cumprod(hazard[:top])
            for j in range(top):
                path = tuple(proposal[: j + 1])
                nodes[path] = max(nodes.get(path, 0.0), float(probability[j]))
        chosen: list[tuple[int, ...]] = []
        taken: set[tuple[int, ...]] = set()
        best_utility, best_count, total = 1.0 / float(curve[1]), 0, 1.0
        for path, p in sorted(nodes.items(), key=lambda item: (-item[1], len(item[0]))):
            if len(chosen) >= max_nodes:
                break
            if len(path) > 1 and path[:-1] not in taken:
                continue
            chosen.append(path)
            taken.add(path)
            total += p
            utility = total / float(curve[len(chosen) + 1])
            if utility > best_utility * (1 + 1e-9):
                best_utility, best_count = utility, len(chosen)
        selected = dict.fromkeys(chosen[:best_count])
        return best_count + 1, accepted_path(selected, trace.target, i, len(trace.target)) + 1

    return S.replay_rounds(traces, surface, round_of)


def fitted_tree(traces, surface, max_len: int, max_nodes: int) -> dict:
    """Tables counted at the tree policy's own round starts (two passes, as the feature study)."""
    return S.fit_tables(lambda tables, fit: run_tree(traces, tables, surface, max_len, max_nodes, fit), max_len)


def _rows(traces, halves, surface, args) -> list:
    plain = {w: S.plain_seconds(S.of(traces, w), surface) for w in S.WORKLOADS}
    L = args.max_draft_len
    tables = [S.fitted(halves[1 - k], "base", surface, L) for k in range(2)]
    rows = [("chain (one drafter a round, as costaware)",
             {w: plain[w] / sum(S.run_policy(S.of(h, w), t, "base", surface, L) for h, t in zip(halves, tables))
              for w in S.WORKLOADS})]
    for cap in NODE_CAPS:
        tables = [fitted_tree(halves[1 - k], surface, L, cap) for k in range(2)]
        rows.append((f"tree of the three drafters' chains, <= {cap} nodes",
                     {w: plain[w] / sum(run_tree(S.of(h, w), t, surface, L, cap) for h, t in zip(halves, tables))
                      for w in S.WORKLOADS}))
    rows.append(("myopic oracle (one chain, every accepted length known)",
                 {w: plain[w] / S.myopic_oracle(S.of(traces, w), surface, L) for w in S.WORKLOADS}))
    return rows


def main() -> None:
    S.study(__doc__.splitlines()[0], "policy", lambda args: max(NODE_CAPS) + 1, _rows)


if __name__ == "__main__":
    main()
