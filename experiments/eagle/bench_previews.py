"""How the costaware controller should use the Eagle head, side by side in one run.

Wall clock, in process (the torch reference engine, SmolLM2-135M fp32, one torch thread),
the same prompts for every method, methods rotated per prompt so that drift hits them alike:

* ``vanilla``: plain decoding; ``suffix@4``: the fixed arm the ratios are taken against;
* ``costaware``: the default controller, Eagle pulled blind (the default, DEFAULT_PREVIEWS off);
* ``costaware+previews``: Eagle previewed every round (its first token and confidence as
  context; drafters/eagle.py, DEFAULT_PREVIEWS; banditspec.decoding.costaware_rounds);
* ``costaware-eagle``: the controller without the Eagle arm (and without the target's
  hidden states, which only Eagle reads).

Every output is checked against plain decoding's. Writes results.md, results.json and
results.png to --out.

    .venv/bin/python experiments/eagle/bench_previews.py [--prompts 12 --workloads code,code-edit,chat,mixed]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import torch
from banditspec.paths import REPO_ROOT

METHODS = ("vanilla", "suffix@4", "costaware", "costaware+previews", "costaware-eagle")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=12, help="prompts per workload")
    parser.add_argument("--workloads", default="code,code-edit,chat,mixed")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=11, help="which prompts of each workload")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "docs" / "benchmarks" / "eagle-previews")
    args = parser.parse_args()
    torch.set_num_threads(1)
    from banditspec_client.bench.in_process import InProcessRunner
    from banditspec_client.bench.methods import parse_methods
    from banditspec_client.bench.runner import RunSettings
    from banditspec_client.bench.workloads import load_workload
    from tqdm import tqdm

    base = {m.name: m for m in parse_methods("vanilla,suffix@4,costaware")}
    methods = [base["vanilla"], base["suffix@4"], base["costaware"],
               dataclasses.replace(base["costaware"], name="costaware+previews"),
               dataclasses.replace(base["costaware"], name="costaware-eagle")]
    runner = InProcessRunner(RunSettings())
    if "eagle" not in runner.adaptive_arms:
        print(f"the eagle arm is not served here: {runner.unavailable.get('eagle', 'not built')}")
        return 1
    every_arm = tuple(runner.adaptive_arms)
    eagle = runner.shared_drafters["eagle"]
    rows = []
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    jobs = [(w, i, p) for w in workloads for i, p in enumerate(load_workload(w, args.prompts, seed=args.seed))]
    for w, i, prompt in tqdm(jobs, desc="prompts"):
        for method in methods[i % len(methods):] + methods[: i % len(methods)]:
            eagle.traits = dataclasses.replace(eagle.traits, previews=method.name == "costaware+previews")
            arms = tuple(a for a in every_arm if not (method.name == "costaware-eagle" and a == "eagle"))
            runner.settings = dataclasses.replace(runner.settings, adaptive_drafters=arms)
            record = runner.run(prompt, method, args.max_tokens)
            rows.append({"workload": w, "prompt": i, "method": method.name, "seconds": record.seconds,
                         "tokens": record.generated_tokens, "digest": record.output_digest,
                         "arms": record.arms, "accepted": record.accepted})
    eagle.traits = dataclasses.replace(eagle.traits, previews=False)
    summary = summarise(rows, workloads)
    args.out.mkdir(parents=True, exist_ok=True)
    settings = {k: v for k, v in vars(args).items() if k != "out"}
    (args.out / "results.json").write_text(json.dumps({"settings": settings,
                                                       "summary": summary, "runs": rows}, indent=1) + "\n")
    text = markdown(summary, args)
    (args.out / "results.md").write_text(text)
    plot(summary, args.out / "results.png")
    print(text)
    return 0 if all(s["identical"] for s in summary.values()) else 1


def summarise(rows: list[dict], workloads: list[str]) -> dict:
    """workload -> {tokens/s per method, ratio to suffix@4, eagle pulls, identical}."""
    out = {}
    for w in workloads:
        mine = [r for r in rows if r["workload"] == w]
        rate = {m: sum(r["tokens"] for r in mine if r["method"] == m) / sum(r["seconds"] for r in mine if r["method"] == m)
                for m in METHODS}
        steps = {m: [a for r in mine if r["method"] == m for a in r["arms"]] for m in METHODS}
        digests: dict[int, set] = {}
        for r in mine:
            digests.setdefault(r["prompt"], set()).add(r["digest"])
        out[w] = {
            "tokens_per_s": {m: round(v, 3) for m, v in rate.items()},
            "vs_suffix4": {m: round(v / rate["suffix@4"], 3) for m, v in rate.items()},
            "eagle_share": {m: round(sum(a.startswith("eagle@") for a in s) / max(1, len(s)), 3)
                            for m, s in steps.items() if m.startswith("costaware")},
            "identical": all(len(d) == 1 for d in digests.values()),
        }
    return out


def markdown(summary: dict, args) -> str:
    lines = [f"# Eagle pulled blind, previewed every round, or not at all "
             f"({args.prompts} prompts per workload, {args.max_tokens} tokens, L = 8, 1 torch thread)", "",
             "tokens/s as a ratio to `suffix@4` in the same run (higher is better); "
             "share of steps drafted by Eagle in brackets.", "",
             "| workload | " + " | ".join(METHODS) + " | identical |",
             "|---|" + "---:|" * len(METHODS) + "---|"]
    for w, s in summary.items():
        cells = []
        for m in METHODS:
            share = s["eagle_share"].get(m)
            cells.append(f"{s['vs_suffix4'][m]:.3f}" + (f" ({share:.0%})" if share is not None else ""))
        lines.append(f"| {w} | " + " | ".join(cells) + f" | {'yes' if s['identical'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(summary)
    shown = [m for m in METHODS if m != "suffix@4"]
    fig, ax = plt.subplots(figsize=(8, 3.6))
    width = 0.8 / len(shown)
    for j, m in enumerate(shown):
        ax.bar(np.arange(len(workloads)) + j * width, [summary[w]["vs_suffix4"][m] for w in workloads], width, label=m)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(np.arange(len(workloads)) + 0.4 - width / 2, workloads)
    ax.set_ylabel("tokens/s vs suffix@4")
    ax.set_ylim(0.5, None)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
