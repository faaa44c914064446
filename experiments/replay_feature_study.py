"""How much could a richer context improve costaware's choices? An offline study on replay traces.

costaware predicts each cheap drafter's accepted length from counts per context (match length
level, agreement on the first token, whether the drafter's previous first token was right).
This study replaces the online counts with tables fitted offline on half of the traces
(2-fold cross-fitting: fitted on one half, scored on the other) and lets a myopic policy choose
(plain, or drafter and gamma maximising expected tokens per second of verify, as costaware
does) with the contexts below; it also reports the myopic oracle, which knows every drafter's
accepted length in advance. If a context helps here, with perfectly fitted tables, it may help
costaware; if not, costaware's choices are limited by what the drafters' proposals reveal.

Contexts (each adds to ``base``, costaware's own context; all causal: only tokens the target
has produced before the round):
  deep    match length levels 0, 1, 2, 3-5, >= 6 instead of 0, 1, 2, >= 3
  agree2  another drafter's proposal agrees on the first two tokens
  nl      the last generated token ends a line or a sentence
  prevm   what the drafter's proposal at the previous round got right so far (0-3 tokens, and
          whether all the tokens since)

    .venv/bin/python experiments/replay_feature_study.py --prompts 40 [--skip 40] [--surface FILE]

Cheap drafters only (pld, suffix, rest); decode cost from the verify-cost surface.
"""

from __future__ import annotations

import argparse
import collections
from collections.abc import Callable
from pathlib import Path

import numpy as np
from banditspec.engine.sampling import count_greedy_accepted
from banditspec_client import replay as R

CHEAP = ("pld", "suffix", "rest")
WORKLOADS = ("code", "code-edit", "chat", "mixed")
MODES = ("base", "deep", "agree2", "nl", "prevm", "deep+agree2+nl+prevm")
LINE_ENDS = frozenset({198, 28, 30, 271})  # SmolLM2: "\n", ",", ".", "\n\n"
A0, B0 = 0.5, 1.5  # costaware's prior


def accepted(proposal: list[int], target: list[int], start: int, max_len: int) -> int:
    """How many of the proposal's first ``max_len`` tokens the target accepts at ``start``."""
    draft = proposal[: min(max_len, len(target) - start)]
    return count_greedy_accepted(np.asarray(target[start : start + len(draft)]), np.asarray(draft))


def plain_seconds(traces, surface) -> float:
    """Plain decoding's decode time over the traces (one one-token verify a position)."""
    return sum(float(surface.curve(len(t.prompt_ids) + i)[1]) for t in traces for i in range(len(t.target) - 1))


def context(trace, drafter: str, i: int, previous: int | None, mode: str) -> tuple:
    proposal = trace.proposals[drafter][i]
    match = trace.match_len[drafter][i]
    edges = (1, 2, 3, 6) if "deep" in mode else (1, 2, 3)
    others = [trace.proposals[o][i] for o in CHEAP if o != drafter and trace.proposals[o][i]]
    last = trace.proposals[drafter][i - 1] if i > 0 else None
    out: list = [sum(match >= e for e in edges), any(o[0] == proposal[0] for o in others),
                 None if not last else last[0] == trace.target[i - 1]]
    if "agree2" in mode:
        out.append(any(o[:2] == proposal[:2] and len(proposal) >= 2 for o in others))
    if "nl" in mode:
        out.append(i > 0 and trace.target[i - 1] in LINE_ENDS)
    if "prevm" in mode:
        earlier = trace.proposals[drafter][previous] if previous is not None else None
        if not earlier:
            out.append(None)
        else:
            known = min(len(earlier), i - previous)
            m = accepted(earlier, trace.target, previous, known)
            out.append((min(m, 3), m == known))
    return tuple(out)


def offers(trace, i: int, previous: int | None, mode: str, tables: dict, max_len: int, fit: dict | None):
    """Each cheap drafter's proposal at round start ``i``: (drafter, proposal, usable length,
    per-position acceptance hazards from ``tables``); with ``fit``, its outcome is counted
    into it (offered, accepted per position)."""
    n = len(trace.target)
    for d in CHEAP:
        proposal = trace.proposals[d][i]
        top = min(len(proposal), max_len, n - 1 - i)
        if top <= 0:
            continue
        key = (d, context(trace, d, i, previous, mode))
        if fit is not None:
            a = accepted(proposal, trace.target, i, top)
            last = min(top, a + 1)
            fit["offered"][key][:last] += 1
            fit["accepted"][key][: min(a, last)] += 1
        offered, acc = tables["offered"].get(key), tables["accepted"].get(key)
        hazard = (np.full(max_len, A0 / (A0 + B0)) if offered is None else (acc + A0) / (offered + A0 + B0))
        yield d, proposal, top, hazard


def replay_rounds(traces, surface, round_of) -> float:
    """Decode seconds of a policy over the traces: at each round start ``i`` (the previous
    one ``previous``), ``round_of(trace, i, previous, curve)`` -> (tokens fed to the verify,
    tokens the round gains); the round costs ``curve[tokens fed]``."""
    spent = 0.0
    for trace in traces:
        i, previous = 0, None
        while i < len(trace.target) - 1:
            curve = surface.curve(len(trace.prompt_ids) + i)
            fed, gained = round_of(trace, i, previous, curve)
            spent += float(curve[fed])
            previous, i = i, i + gained
    return spent


def run_policy(traces, tables, mode: str, surface, max_len: int, fit: dict | None = None) -> float:
    """The policy's decode seconds; with ``fit``, also count every cheap proposal's outcome at
    the round starts into it (offered, accepted per position)."""

    def round_of(trace, i, previous, curve):
        best = (1.0 / curve[1], None, 0)
        for d, _, top, hazard in offers(trace, i, previous, mode, tables, max_len, fit):
            expected = 1 + np.cumsum(np.cumprod(hazard[:top]))
            utility = expected / curve[2 : top + 2]
            g = int(np.argmax(utility))
            if utility[g] > best[0] * (1 + 1e-9):
                best = (float(utility[g]), d, g + 1)
        _, d, gamma = best
        if d is None:
            return 1, 1
        return gamma + 1, accepted(trace.proposals[d][i], trace.target, i, gamma) + 1

    return replay_rounds(traces, surface, round_of)


def myopic_oracle(traces, surface, max_len: int) -> float:
    """Decode seconds when every round knows each drafter's accepted length in advance."""

    def round_of(trace, i, previous, curve):
        best = (1.0 / curve[1], 0)
        for d in CHEAP:
            a = min(accepted(trace.proposals[d][i], trace.target, i, max_len), len(trace.target) - 1 - i)
            if a > 0 and (a + 1) / curve[a + 1] > best[0]:
                best = ((a + 1) / curve[a + 1], a)
        return best[1] + 1, best[1] + 1

    return replay_rounds(traces, surface, round_of)


def fit_tables(run: Callable[[dict, dict], object], max_len: int) -> dict:
    """Tables counted at the round starts of a policy itself (``run(tables, fit)`` runs it,
    counting into ``fit``), two passes: the first with no tables (costaware's prior), the
    second with the first pass's tables."""
    tables: dict = {"offered": {}, "accepted": {}}
    for _ in range(2):
        fit: dict = {"offered": collections.defaultdict(lambda: np.zeros(max_len)),
                     "accepted": collections.defaultdict(lambda: np.zeros(max_len))}
        run(tables, fit)
        tables = {"offered": dict(fit["offered"]), "accepted": dict(fit["accepted"])}
    return tables


def fitted(traces, mode: str, surface, max_len: int) -> dict:
    return fit_tables(lambda tables, fit: run_policy(traces, tables, mode, surface, max_len, fit), max_len)


def of(traces, workload: str) -> list:
    """The traces of one workload ("mixed": all)."""
    return [t for t in traces if workload == "mixed" or t.kind == workload]


def study(description: str, first_column: str, surface_tokens: Callable[[argparse.Namespace], int],
          rows_of: Callable[[list, list, object, argparse.Namespace], list]) -> None:
    """What both studies share: arguments, the traces (recorded once, cached), the surface,
    and the table (speed-up over plain decoding per workload; printed, and with --out saved).
    ``rows_of(traces, halves, surface, args)`` -> [(name, {workload: plain / policy seconds})]."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--prompts", type=int, default=40)
    parser.add_argument("--skip", type=int, default=0)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--max-draft-len", type=int, default=8)
    parser.add_argument("--surface", type=Path, default=R.SURFACE_JSON)
    parser.add_argument("--out", type=Path, default=None, help="write the table here (markdown)")
    args = parser.parse_args()
    ns = argparse.Namespace(prompts_file=None, workloads="code,code-edit,chat", prompts=args.prompts, skip=args.skip,
                            model="smollm2", max_tokens=args.max_tokens, record_len=args.max_draft_len,
                            drafters=",".join(CHEAP), threads=2, batch=8)
    traces, _ = R.record(ns, R._prompts(ns))
    surface = R._surface_model(surface_tokens(args), args.surface)
    rows = rows_of(traces, [traces[0::2], traces[1::2]], surface, args)
    lines = [f"{len(traces)} traces (--prompts {args.prompts} --skip {args.skip}), {args.max_tokens} tokens, "
             f"L = {args.max_draft_len}, surface {args.surface}; speed-up over plain decoding (decode only)", "",
             f"| {first_column} | " + " | ".join(WORKLOADS) + " |", "|---|" + "---:|" * len(WORKLOADS)]
    lines += [f"| {name} | " + " | ".join(f"{speeds[w]:.3f}x" for w in WORKLOADS) + " |" for name, speeds in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)


def _rows(traces, halves, surface, args) -> list:
    plain = {w: plain_seconds(of(traces, w), surface) for w in WORKLOADS}
    rows = []
    for mode in MODES:
        tables = [fitted(halves[1 - k], mode, surface, args.max_draft_len) for k in range(2)]
        rows.append((mode, {w: plain[w] / sum(run_policy(of(half, w), table, mode, surface, args.max_draft_len)
                                              for half, table in zip(halves, tables)) for w in WORKLOADS}))
    rows.append(("myopic oracle", {w: plain[w] / myopic_oracle(of(traces, w), surface, args.max_draft_len)
                                   for w in WORKLOADS}))
    return rows


def main() -> None:
    study(__doc__.splitlines()[0], "context", lambda args: args.max_draft_len + 1, _rows)


if __name__ == "__main__":
    main()
