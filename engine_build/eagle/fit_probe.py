"""Fit the Eagle head's first-token probe (banditspec.eagle.probe) and store it in the head's JSON.

For each training prompt (the first ``--prompts`` of the chat, code and code-edit workloads, in
the project's fixed order: never the 125th-164th, which the benchmarks hold out) the target
decodes greedily; then, at every generated position, the head (as served: int8, its tuned
cut-off) previews its first token from the target's features, exactly as a pull would begin.
A position is a "hit" when the head would draft (confidence >= cut-off) and its token is the
target's. A logistic regression (L2, Newton steps) on the target's feature row that produced
the latest token predicts the hit; held-out prompts (every fifth) measure it (AUC and a
calibration table), then the probe is refitted on all positions and written into the JSON
beside the weights under ``first_token_probe``.

    .venv/bin/python engine_build/eagle/fit_probe.py [--prompts 100] [--max-new-tokens 64]
        [--weights python_backend/banditspec/eagle/weights/eagle-smollm2.safetensors] [--dry-run]

~10 minutes for 300 prompts on the 2-core machine (1 torch thread).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
from banditspec.drafters.eagle import DEFAULT_WEIGHTS, load_default_eagle_drafter
from banditspec.eagle.probe import PROBE_KEY, FirstTokenProbe
from banditspec.engine.contract import VerifyRequest
from banditspec.engine.models import load_model
from banditspec.engine.reference import ReferenceEngine
from banditspec.text import prompt_ids
from banditspec_client.bench.workloads import load_workload
from tqdm import tqdm

WORKLOADS = ("chat", "code", "code-edit")
CALIBRATION_EDGES = (0.0, 0.03, 0.06, 0.1, 0.15, 0.2, 0.3, 0.4, 0.6, 1.0001)


def positions(engine, drafter, ids: list[int], max_new: int, eos: int):
    """(feature rows [n, F], hit [n]) at each generated position of a greedy continuation of
    ``ids``: the feature that produced the latest token, and whether the head's preview hits.
    Decoded and featurised by the serving engine (not banditspec_train's transformers
    helpers), so the rows are exactly those the controller's probe reads."""
    seq = list(ids)
    for _ in range(max_new):
        (result,) = engine.verify([VerifyRequest(input_ids=np.asarray(seq, np.int32), end_id=eos)])
        token = int(np.asarray(result.output_ids).reshape(-1)[0])
        if token == eos:
            break
        seq.append(token)
    (result,) = engine.verify([VerifyRequest(input_ids=np.asarray(seq, np.int32), hidden_from=0,
                                             hidden_layers=drafter.traits.feature_layers)])
    features = np.asarray(result.hidden_states, dtype=np.float32)  # [len(seq) (+1), F]: positions 0..
    session = drafter.start(ids)
    start = len(ids)
    if len(seq) < start + 2:
        return np.zeros((0, features.shape[1]), np.float32), np.zeros(0, bool)
    session.observe([seq[start]], features[session.first_feature:start])
    rows, hits = [], []
    for n in range(start + 1, len(seq)):  # the preview predicts seq[n]; the latest feature row is n - 2
        preview = session.preview()
        rows.append(features[n - 2])
        hits.append(not preview.declines and preview.token == seq[n])
        session.observe([seq[n]], features[n - 1:n])
    return np.stack(rows), np.asarray(hits)


def logistic(x: np.ndarray, y: np.ndarray, l2: float, iters: int = 50) -> tuple[np.ndarray, float]:
    """L2-regularised logistic regression by Newton steps: (weights [F], bias)."""
    design = np.hstack([x, np.ones((len(x), 1))]).astype(np.float64)
    w = np.zeros(design.shape[1])
    penalty = np.r_[np.full(x.shape[1], l2), 0.0]
    for _ in range(iters):
        p = 1.0 / (1.0 + np.exp(-design @ w))
        grad = design.T @ (p - y) + penalty * w
        hess = (design * (p * (1 - p))[:, None]).T @ design + np.diag(penalty)
        step = np.linalg.solve(hess, grad)
        w -= step
        if np.abs(step).max() < 1e-7:
            break
    return w[:-1], float(w[-1])


def auc(score: np.ndarray, label: np.ndarray) -> float:
    order = np.argsort(score)
    ranks = np.empty(len(score))
    ranks[order] = np.arange(1, len(score) + 1)
    pos = label.sum()
    neg = len(label) - pos
    return float((ranks[label].sum() - pos * (pos + 1) / 2) / (pos * neg))


def fitted(x: np.ndarray, y: np.ndarray, l2: float) -> FirstTokenProbe:
    """The probe on raw rows: fitted on standardised ones, the standardisation folded in."""
    mean, scale = x.mean(0), x.std(0) + 1e-6
    w, b = logistic((x - mean) / scale, y.astype(np.float64), l2)
    return FirstTokenProbe((w / scale).astype(np.float32), b - float(np.dot(w / scale, mean)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=100, help="per workload (the first N, never the held-out 125th-164th)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--l2", type=float, default=100.0)
    parser.add_argument("--weights", type=Path, default=DEFAULT_WEIGHTS)
    parser.add_argument("--dry-run", action="store_true", help="report, do not write the JSON")
    args = parser.parse_args()
    if args.prompts > 124:
        parser.error("--prompts must stay below 125 (the benchmarks hold out the 125th-164th)")
    torch.set_num_threads(1)
    model, tokenizer = load_model("smollm2")
    engine = ReferenceEngine(model)
    drafter = load_default_eagle_drafter(model, args.weights, probe=False)
    xs, ys, group, kind = [], [], [], []
    prompts = [(w, p) for w in WORKLOADS for p in load_workload(w, args.prompts)]
    for index, (workload, prompt) in enumerate(tqdm(prompts, desc="greedy + previews")):
        ids = prompt_ids(tokenizer, prompt.text, chat=True)
        rows, hits = positions(engine, drafter, ids, args.max_new_tokens, int(tokenizer.eos_token_id))
        xs.append(rows)
        ys.append(hits)
        group += [index] * len(hits)
        kind += [workload] * len(hits)
    x, y = np.concatenate(xs), np.concatenate(ys)
    held_out = np.asarray(group) % 5 == 0
    kinds = np.asarray(kind)
    probe = fitted(x[~held_out], y[~held_out], args.l2)
    p = np.asarray([probe(row) for row in x[held_out]])
    y_test = y[held_out]
    report = {"positions": int(len(y)), "hit_rate": round(float(y.mean()), 4),
              "held_out_auc": round(auc(p, y_test), 4),
              "held_out_auc_by_workload": {w: round(auc(p[kinds[held_out] == w], y_test[kinds[held_out] == w]), 4)
                                           for w in WORKLOADS},
              "calibration": []}
    for lo, hi in zip(CALIBRATION_EDGES, CALIBRATION_EDGES[1:]):
        m = (p >= lo) & (p < hi)
        report["calibration"].append({"p": [lo, min(hi, 1.0)], "share": round(float(m.mean()), 4),
                                      "hit": round(float(y_test[m].mean()), 4) if m.any() else None})
    print(json.dumps(report, indent=1))
    final = fitted(x, y, args.l2)  # all positions
    about = {"target_feature": "the target's feature row that produced the latest token (what the head reads)",
             "hit": "the head would draft (confidence >= its cut-off) and the target accepts its first token",
             "data": {"workloads": list(WORKLOADS), "prompts_per_workload": args.prompts,
                      "max_new_tokens": args.max_new_tokens, "l2": args.l2},
             "held_out": report, "command": "engine_build/eagle/fit_probe.py " + " ".join(sys.argv[1:])}
    if not args.dry_run:
        path = Path(args.weights).with_suffix(".json")
        info = json.loads(path.read_text())
        info[PROBE_KEY] = final.as_json(**about)
        path.write_text(json.dumps(info, indent=2) + "\n")
        print(f"wrote {PROBE_KEY} into {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
