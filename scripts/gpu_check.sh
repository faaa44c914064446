#!/usr/bin/env bash
# One GPU check of the TensorRT-LLM deployment, ready to run; it has never run (the project has
# no GPU). Inside the banditspec-gpu image (nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3,
# TensorRT-LLM 1.2.1) on a machine with an NVIDIA GPU and access to Hugging Face:
#
#   docker run --rm --gpus all --shm-size=2g -v "$PWD":/work -v /srv/models:/models \
#     banditspec-gpu bash /work/scripts/gpu_check.sh /models [EAGLE1_CHECKPOINT_DIR]
#
# It builds SmolLM2 engines (target, draft, and Eagle when an EAGLE-1 checkpoint of the target
# and EAGLE_CONVERT=<TensorRT-LLM v1.2.1>/examples/eagle/convert_checkpoint.py are given),
# starts tritonserver on the filled repository and prints one line per check:
#   greedy output of every arm == the target alone; sampling differs across seeds (and repeats
#   for a seed); KV-cache blocks reused after the first step; tokens/s of the default policy
#   against plain decoding; the served target's tensors against the upstream contract table.
# Exit status: 0 when every check passed.
set -uo pipefail

MODELS="${1:?usage: gpu_check.sh MODELS_DIR [EAGLE1_CHECKPOINT_DIR]}"
EAGLE_HF="${2:-}"
TARGET_REPO="${TARGET_REPO:-HuggingFaceTB/SmolLM2-360M-Instruct}"
DRAFT_REPO="${DRAFT_REPO:-HuggingFaceTB/SmolLM2-135M-Instruct}"
HERE="$(cd "$(dirname "$0")/.." && pwd)"
PROJECT="${PROJECT:-$([ -d /opt/banditspec ] && echo /opt/banditspec || echo "$HERE")}"
OUT="$MODELS/gpu_check"
LOG="$OUT/tritonserver.log"
PORT="${HTTP_PORT:-8000}"
mkdir -p "$OUT"
start=$(date +%s)
say() { printf '%-10s %s\n' "$1" "$2"; }

# 1. checkpoints (skipped when present)
for pair in "target:$TARGET_REPO" "draft:$DRAFT_REPO"; do
  role="${pair%%:*}"; repo="${pair#*:}"
  if [ ! -f "$OUT/hf/$role/config.json" ]; then
    python3 -c "import sys; from huggingface_hub import snapshot_download; snapshot_download(sys.argv[1], local_dir=sys.argv[2])" \
      "$repo" "$OUT/hf/$role" >/dev/null || { say FAIL "download $repo"; exit 1; }
  fi
done

# 2. engines and the filled repository
eagle_args=()
if [ -n "$EAGLE_HF" ]; then
  eagle_args=(--eagle-hf "$EAGLE_HF" --eagle-convert-script "${EAGLE_CONVERT:?set EAGLE_CONVERT to examples/eagle/convert_checkpoint.py of TensorRT-LLM v1.2.1}")
fi
if timeout 420 python3 "$PROJECT/engine_build/trtllm/build_engines.py" \
    --target-hf "$OUT/hf/target" --draft-hf "$OUT/hf/draft" --out "$OUT/trtllm" \
    --max-draft-len 4 --max-batch-size 4 --max-seq-len 2048 --max-prompt-len 1024 --max-num-tokens 2048 \
    "${eagle_args[@]}" >"$OUT/build.log" 2>&1; then
  say PASS "engines built in $(( $(date +%s) - start )) s ($OUT/trtllm/engines)"
else
  say FAIL "engine build (log: $OUT/build.log)"; tail -20 "$OUT/build.log"; exit 1
fi

# 3. server
tritonserver --model-repository="$OUT/trtllm/model_repository" --model-control-mode=none \
  --http-port="$PORT" --grpc-port=$((PORT + 1)) --metrics-port=$((PORT + 2)) >"$LOG" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null; wait "$server" 2>/dev/null' EXIT
for _ in $(seq 1 150); do
  curl -sf "localhost:$PORT/v2/health/ready" >/dev/null && break
  kill -0 "$server" 2>/dev/null || { say FAIL "tritonserver exited (log: $LOG)"; tail -30 "$LOG"; exit 1; }
  sleep 2
done
curl -sf "localhost:$PORT/v2/health/ready" >/dev/null || { say FAIL "server not ready (log: $LOG)"; exit 1; }
say PASS "server ready in $(( $(date +%s) - start )) s"

# 4. the checks, through plain HTTP (no client library needed)
timeout 300 python3 - "$PORT" "$OUT/trtllm/tokenizer" "$PROJECT/tests/trtllm_standin/contract.json" "${EAGLE_HF:+eagle}" <<'PY'
import json, sys, time, urllib.request

port, tokenizer_dir, contract_path, eagle = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "eagle"
base = f"http://localhost:{port}/v2/models"
failed = False


def post(path, body):
    req = urllib.request.Request(f"{base}/{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def generate(prompt, **fields):
    return post("banditspec/generate", {"text_input": prompt, "max_tokens": 64, **fields})


def line(ok, name, detail):
    global failed
    failed |= not ok
    print(f"{'PASS' if ok else 'FAIL':<10} {name}: {detail}", flush=True)


prompts = [
    "Rewrite this function with type hints and keep the body unchanged:\n\ndef area(w, h):\n    return w * h\n",
    "Write a Python function that returns the n-th Fibonacci number.",
    "What are two good habits for writing clean code?",
]
plain = {p: generate(p, policy="vanilla")["text_output"] for p in prompts}
arms = ["pld", "suffix", "rest", "draft"] + (["eagle"] if eagle else [])
for policy in [f"fixed:{a}" for a in arms] + ["costaware", "ucbspec", "exp3spec", "uniform"]:
    bad = [p for p in prompts if generate(p, policy=policy)["text_output"] != plain[p]]
    line(not bad, f"greedy {policy} == target alone", "3/3 prompts" if not bad else f"first differing prompt {bad[0]!r}")

p = prompts[2]
# fixed:draft for the replay: its drafts depend on the request alone (the suffix arm also
# learns from earlier requests, so a replay under a bandit policy may see other drafts).
s1, s1b, s2 = (generate(p, policy="fixed:draft", temperature=0.8, random_seed=s)["text_output"] for s in (1, 1, 2))
u1, u2 = (generate(p, temperature=0.8, random_seed=s)["text_output"] for s in (1, 2))
line(s1 != s2 and s1 == s1b and s1 != plain[p] and u1 != u2, "sampling",
     f"seed 1 == seed 1: {s1 == s1b}; seed 1 != seed 2: {s1 != s2} (default policy: {u1 != u2}); != greedy: {s1 != plain[p]}")

from transformers import AutoTokenizer  # noqa: E402

tok = AutoTokenizer.from_pretrained(tokenizer_dir)
ids = tok(" ".join(["The quick brown fox jumps over the lazy dog."] * 40))["input_ids"][:400]


def target(tokens, n):
    body = {
        "inputs": [
            {"name": "input_ids", "shape": [1, len(tokens)], "datatype": "INT32", "data": tokens},
            {"name": "input_lengths", "shape": [1, 1], "datatype": "INT32", "data": [len(tokens)]},
            {"name": "request_output_len", "shape": [1, 1], "datatype": "INT32", "data": [n]},
            {"name": "return_perf_metrics", "shape": [1, 1], "datatype": "BOOL", "data": [True]},
        ],
        "outputs": [{"name": "output_ids"}, {"name": "sequence_length"}, {"name": "kv_cache_reused_blocks"}],
    }
    out = {o["name"]: o["data"] for o in post("target/infer", body)["outputs"]}
    return out["output_ids"][: out["sequence_length"][0]], out["kv_cache_reused_blocks"][0]


first, reused0 = target(ids, 1)
_, reused1 = target(ids + first, 1)
line(reused1 > 0, "KV reuse after the first step", f"kv_cache_reused_blocks {reused0} -> {reused1} ({len(ids)}-token prompt)")


def rate(policy):
    """Generated tokens per second over the prompts; policy None = the server's default policy."""
    tokens, seconds = 0, 0.0
    for q in prompts:
        body = {"text_input": q, "max_tokens": 128, **({"policy": policy} if policy else {})}
        t = time.perf_counter()
        stats = json.loads(post("banditspec/generate", body)["speculation_stats"])
        seconds += time.perf_counter() - t
        tokens += stats["generated_tokens"]
    return tokens / seconds


generate(prompts[0])  # warm-up
default, vanilla = rate(None), rate("vanilla")
print(f"{'INFO':<10} tokens/s: default policy {default:.1f}, plain decoding {vanilla:.1f} ({default / vanilla:.2f}x), 3 prompts x 128 tokens", flush=True)

contract = json.load(open(contract_path))
fill = contract["template_values"]
upstream = {t["name"]: fill.get(t["data_type"][2:-1], t["data_type"]) for t in contract["inputs"] + contract["outputs"]}
with urllib.request.urlopen(f"{base}/target/config", timeout=30) as r:
    served = json.loads(r.read())
diff = [f"{t['name']} {t['data_type']}" for t in served.get("input", []) + served.get("output", []) if upstream.get(t["name"]) != t["data_type"]]
line(not diff, "served target tensors == upstream table", "all" if not diff else ", ".join(diff))
sys.exit(1 if failed else 0)
PY
status=$?
say INFO "total $(( $(date +%s) - start )) s"
exit $status
