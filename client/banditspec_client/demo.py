"""``banditspec demo``: start a real tritonserver, send a few prompts through Triton,
and show outputs, per-arm statistics and speed against plain decoding (measured here,
side by side, same server)."""

from __future__ import annotations

import argparse

from banditspec.config import DEFAULT_POLICY
from banditspec.paths import cache_dir

DEMO_PROMPTS = (
    (
        "code-edit",
        "Add a docstring to this function and return the code unchanged otherwise:\n\n"
        "def moving_average(values, window):\n"
        "    if window <= 0:\n"
        "        raise ValueError('window must be positive')\n"
        "    sums = [0]\n"
        "    for v in values:\n"
        "        sums.append(sums[-1] + v)\n"
        "    return [(sums[i + window] - sums[i]) / window for i in range(len(values) - window + 1)]\n",
    ),
    ("code", "Write a Python function that checks whether a string is a palindrome, with a short docstring."),
    ("chat", "Give me three tips for staying focused while working from home."),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--policy", default=DEFAULT_POLICY)


def run(args: argparse.Namespace) -> int:
    from banditspec_server.serve import TritonServer

    from banditspec_client.triton_client import GenerationOptions, generate_grpc

    log = cache_dir() / "demo-tritonserver.log"
    server = TritonServer(model=args.model, http_port=0, grpc_port=0, metrics_port=0, log_path=log)
    print(f"starting tritonserver with model {args.model} (log: {log}) ...", flush=True)
    rows = []
    with server:
        print(f"ready: gRPC {server.grpc_url}, HTTP {server.http_url}\n", flush=True)
        for name, prompt in DEMO_PROMPTS:
            print(f"=== {name}: {prompt.splitlines()[0][:70]}")
            plain = generate_grpc(server.grpc_url, prompt, GenerationOptions(max_tokens=args.max_tokens, policy="vanilla"))
            print("--- streamed through Triton with", args.policy, "---")
            spec = generate_grpc(
                server.grpc_url,
                prompt,
                GenerationOptions(max_tokens=args.max_tokens, policy=args.policy, stream=True),
                on_text=lambda piece: print(piece, end="", flush=True),
            )
            print("\n")
            per_arm = ", ".join(
                f"{arm} {v['pulls']}x {v['accepted']}/{v['drafted']}" for arm, v in spec.stats.get("per_arm", {}).items()
            )
            rows.append((name, plain, spec, per_arm))
    print(f"{'prompt':10} {'tokens':>6} {'vanilla tok/s':>13} {args.policy + ' tok/s':>14} {'speedup':>7} {'MAT':>5} {'same text':>9}  arms (pulls, accepted/drafted)")
    for name, plain, spec, per_arm in rows:
        n = spec.stats.get("generated_tokens", 0)
        v_rate = plain.stats.get("generated_tokens", 0) / plain.seconds
        s_rate = n / spec.seconds
        print(
            f"{name:10} {n:>6} {v_rate:>13.1f} {s_rate:>14.1f} {s_rate / v_rate:>6.2f}x "
            f"{spec.stats.get('mean_accepted_tokens', 0):>5.2f} {str(plain.text == spec.text):>9}  {per_arm}"
        )
    same = all(plain.text == spec.text for _, plain, spec, _ in rows)
    print("\nlossless: speculative output equals plain decoding on every prompt" if same else "\nMISMATCH against plain decoding")
    return 0 if same else 1
