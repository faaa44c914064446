"""The Eagle arm through a real tritonserver: what one `eagle` model call costs against one
`target` call, and tokens/s of `fixed:eagle` against plain decoding and `fixed:pld`.

Starts the server (SmolLM2), sends the same chat prompts (ShareGPT eval split) under each
policy, one request at a time, rotating the policy order per prompt, and reads Triton's own
per-model counters (`nv_inference_count`, `nv_inference_compute_infer_duration_us`) before
and after each request. Greedy outputs are checked equal across policies.

    .venv/bin/python experiments/eagle/triton_costs.py [--prompts 6 --max-tokens 96]
        [--out docs/eagle/triton_costs.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from banditspec.paths import REPO_ROOT, cache_dir
from banditspec_client.prometheus_text import metric_total, scrape_metrics
from banditspec_client.triton_client import GenerationOptions, generate_grpc
from banditspec_server.serve import TritonServer, free_port
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_eagle import chat_prompts  # noqa: E402

POLICIES = ("vanilla", "fixed:pld", "fixed:eagle")
COUNTERS = ("nv_inference_count", "nv_inference_compute_infer_duration_us")


def model_counters(port: int) -> dict[str, dict[str, float]]:
    series = scrape_metrics(port)
    return {m: {c: metric_total(series, c, model=m) for c in COUNTERS} for m in ("target", "eagle")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--skip", type=int, default=0,
                        help="start after this many prompts (the first 12-24 tuned the heads' cut-offs)")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--max-draft-len", type=int, default=4)
    parser.add_argument("--eagle-head", default="", choices=("", "eagle1", "eagle3"),
                        help="the shipped head served (both models' eagle_head parameter)")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "docs" / "eagle" / "triton_costs.json")
    args = parser.parse_args()
    prompts = chat_prompts(args.skip + args.prompts)[args.skip:]
    per_policy = {p: {"tokens": 0, "seconds": 0.0, "steps": 0, "drafted": 0, "target_calls": 0, "target_us": 0.0,
                      "eagle_calls": 0, "eagle_us": 0.0} for p in POLICIES}
    mismatches = 0
    log = cache_dir() / "eagle-triton-costs.log"
    with TritonServer(model="smollm2", http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                      log_path=log, overrides={"target": {"torch_threads": "1"},
                                               "eagle": {"eagle_head": args.eagle_head},
                                               "banditspec": {"eagle_head": args.eagle_head}}) as server:
        for policy in POLICIES:  # warm-up: first calls load lazily
            generate_grpc(server.grpc_url, "Hello!", GenerationOptions(max_tokens=8, policy=policy))
        for i, prompt in enumerate(tqdm(prompts, desc="prompts", unit="prompt")):
            texts = {}
            for policy in POLICIES[i % len(POLICIES):] + POLICIES[:i % len(POLICIES)]:
                before = model_counters(server.metrics_port)
                started = time.perf_counter()
                result = generate_grpc(server.grpc_url, prompt, GenerationOptions(
                    max_tokens=args.max_tokens, policy=policy, max_draft_len=args.max_draft_len))
                seconds = time.perf_counter() - started
                after = model_counters(server.metrics_port)
                row = per_policy[policy]
                row["tokens"] += result.stats["generated_tokens"]
                row["steps"] += result.stats["steps"]
                row["drafted"] += sum(result.stats["drafted"])
                row["seconds"] += seconds
                for model in ("target", "eagle"):
                    row[f"{model}_calls"] += after[model][COUNTERS[0]] - before[model][COUNTERS[0]]
                    row[f"{model}_us"] += after[model][COUNTERS[1]] - before[model][COUNTERS[1]]
                texts[policy] = result.text
            mismatches += len(set(texts.values())) != 1
    report = {"eagle_head": args.eagle_head or "default", "prompts": len(prompts), "skip": args.skip,
              "max_tokens": args.max_tokens,
              "max_draft_len": args.max_draft_len,
              "output_mismatches": mismatches, "policies": {}}
    for policy, row in per_policy.items():
        report["policies"][policy] = {
            "tokens_per_second": round(row["tokens"] / row["seconds"], 2),
            "mean_accepted_tokens": round(row["tokens"] / max(row["steps"], 1), 3),
            "target_calls": int(row["target_calls"]),
            "target_ms_per_call": round(row["target_us"] / max(row["target_calls"], 1) / 1000, 2),
            "eagle_calls": int(row["eagle_calls"]),
            "eagle_ms_per_call": round(row["eagle_us"] / max(row["eagle_calls"], 1) / 1000, 2) if row["eagle_calls"] else None,
            "drafted_tokens": int(row["drafted"]),
            # an eagle call's time spread over the draft steps it made (calls that drafted nothing included)
            "eagle_ms_per_drafted_token": round(row["eagle_us"] / row["drafted"] / 1000, 3)
            if row["eagle_calls"] and row["drafted"] else None,
        }
    vanilla = report["policies"]["vanilla"]
    eagle = report["policies"]["fixed:eagle"]
    report["eagle_call_over_plain_target_step"] = round(eagle["eagle_ms_per_call"] / vanilla["target_ms_per_call"], 3)
    if eagle["eagle_ms_per_drafted_token"] is not None:
        report["eagle_draft_step_over_plain_target_step"] = round(
            eagle["eagle_ms_per_drafted_token"] / vanilla["target_ms_per_call"], 3)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
