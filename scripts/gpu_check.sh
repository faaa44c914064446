#!/usr/bin/env bash
# The first GPU run's check of the TensorRT-LLM deployment, one PASS/FAIL line per check.
#
# On a GPU, inside the banditspec-gpu image (nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3,
# TensorRT-LLM 1.2.1; it runs as uid 10001), with access to Hugging Face:
#
#   docker run --rm --gpus all --shm-size=2g -v /srv/models:/models \
#     banditspec-gpu bash /opt/banditspec/scripts/gpu_check.sh /models [EAGLE1_CHECKPOINT_DIR]
#
# It downloads the SmolLM2 checkpoints (weights, config and tokenizer files only), builds the
# engines with engine_build/trtllm/build_engines.py (target, draft, and Eagle when an EAGLE-1
# checkpoint and EAGLE_CONVERT=<TensorRT-LLM v1.2.1>/examples/eagle/convert_checkpoint.py are
# given), and starts tritonserver the way upstream's launch_triton_server.py --multi-model starts
# several TensorRT-LLM models in one server (TRTLLM_ORCHESTRATOR=1,
# TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES=1, world size 1).
#
#   gpu_check.sh --dry-run
#
# runs the same checks on CPU against the TensorRT-LLM stand-in (tests/trtllm_standin: the same
# filled configs, the stand-in installed as backend `tensorrtllm`), from a project checkout with
# its virtual environment active.
#
# Output folder: $GPU_CHECK_OUT, else MODELS_DIR/gpu_check when this user may write there, else
# /tmp/gpu_check (an INFO line says which). INFO lines carry figures. Exit status 0 when every
# check passed, 1 otherwise. Thresholds: see the check script below (GREEDY_MIN_MATCH).
set -euo pipefail

DRY_RUN=0
if [ "${1:-}" = "--dry-run" ]; then DRY_RUN=1; shift; fi
HERE="$(cd "$(dirname "$0")/.." && pwd)"
PROJECT="${PROJECT:-$([ "$DRY_RUN" = 0 ] && [ -d /opt/banditspec ] && echo /opt/banditspec || echo "$HERE")}"
PY="${PYTHON:-python3}"
start=$(date +%s)
say() { printf '%-6s %s\n' "$1" "$2"; }
writable() { mkdir -p "$1" 2>/dev/null && [ -w "$1" ]; }
server=""
cleanup() { if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi; }
trap cleanup EXIT

if [ "$DRY_RUN" = 1 ]; then
  OUT="${GPU_CHECK_OUT:-${TMPDIR:-/tmp}/gpu_check_dry_run}"
else
  MODELS="${1:?usage: gpu_check.sh MODELS_DIR [EAGLE1_CHECKPOINT_DIR] | gpu_check.sh --dry-run}"
  EAGLE_HF="${2:-}"
  OUT="${GPU_CHECK_OUT:-$MODELS/gpu_check}"
fi
if ! writable "$OUT"; then
  say INFO "$OUT is not writable by uid $(id -u); writing to /tmp/gpu_check instead"
  OUT=/tmp/gpu_check
  writable "$OUT" || { say FAIL "no writable output folder ($OUT)"; exit 1; }
fi
LOG="$OUT/tritonserver.log"
rm -f "$OUT/ports"

if [ "$DRY_RUN" = 1 ]; then
  # The stand-in server: build_engines' fill of model_repository_trtllm/, served as on a GPU.
  rm -rf "$OUT/standin"
  cd "$PROJECT"
  "$PY" - "$OUT" >"$LOG" 2>&1 <<'PY' &
import json, signal, sys, time
from pathlib import Path

from tests.trtllm_standin.repository import backend_dir, build_repository, standin_server

out = Path(sys.argv[1])
params = {"drafters": "pld,suffix,draft,eagle", "eagle_model": "draft"}
repository, spec = build_repository(out / "standin", model="tiny", banditspec_params=params)
server = standin_server(repository, backend_dir(out / "standin" / "backends"), model="tiny",
                        log_path=out / "standin" / "server.log",
                        overrides={"banditspec": {**params, "drafter_deadline_ms": "10000"}})
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
with server:
    (out / "ports").write_text(json.dumps({"http": server.http_port, "metrics": server.metrics_port,
                                           "tokenizer": "model:tiny", "arms": "pld,suffix,draft,eagle"}))
    while True:
        time.sleep(1)
PY
  server=$!
else
  TARGET_REPO="${TARGET_REPO:-HuggingFaceTB/SmolLM2-360M-Instruct}"
  DRAFT_REPO="${DRAFT_REPO:-HuggingFaceTB/SmolLM2-135M-Instruct}"
  PORT="${HTTP_PORT:-8000}"
  for pair in "target:$TARGET_REPO" "draft:$DRAFT_REPO"; do
    role="${pair%%:*}"; repo="${pair#*:}"
    if [ ! -f "$OUT/hf/$role/config.json" ]; then
      if ! "$PY" -c "import sys; from huggingface_hub import snapshot_download; snapshot_download(sys.argv[1], local_dir=sys.argv[2], allow_patterns=['*.json', '*.safetensors', '*.txt', '*.jinja', 'tokenizer.model'])" \
          "$repo" "$OUT/hf/$role" >"$OUT/download.log" 2>&1; then
        say FAIL "download $repo (log: $OUT/download.log)"; exit 1
      fi
    fi
  done
  eagle_args=()
  if [ -n "$EAGLE_HF" ]; then
    if [ -z "${EAGLE_CONVERT:-}" ]; then say FAIL "EAGLE_CONVERT: set it to examples/eagle/convert_checkpoint.py of TensorRT-LLM v1.2.1"; exit 1; fi
    eagle_args=(--eagle-hf "$EAGLE_HF" --eagle-convert-script "$EAGLE_CONVERT")
  fi
  if timeout 420 "$PY" "$PROJECT/engine_build/trtllm/build_engines.py" \
      --target-hf "$OUT/hf/target" --draft-hf "$OUT/hf/draft" --out "$OUT/trtllm" \
      --max-draft-len 4 --max-batch-size 4 --max-seq-len 2048 --max-prompt-len 1024 --max-num-tokens 2048 \
      ${eagle_args[@]+"${eagle_args[@]}"} >"$OUT/build.log" 2>&1; then
    say PASS "engines built in $(( $(date +%s) - start )) s ($OUT/trtllm/engines)"
  else
    say FAIL "engine build (log: $OUT/build.log)"; exit 1
  fi
  TRTLLM_ORCHESTRATOR=1 TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES=1 \
    tritonserver --model-repository="$OUT/trtllm/model_repository" --model-control-mode=none \
      --http-port="$PORT" --grpc-port=$((PORT + 1)) --metrics-port=$((PORT + 2)) >"$LOG" 2>&1 &
  server=$!
  arms="pld,suffix,rest,draft${EAGLE_HF:+,eagle}"
  printf '{"http": %s, "metrics": %s, "tokenizer": "%s", "arms": "%s"}' "$PORT" $((PORT + 2)) \
    "$OUT/trtllm/tokenizer" "$arms" >"$OUT/ports"
fi

ready=0
for _ in $(seq 1 300); do
  if [ -f "$OUT/ports" ]; then
    port=$("$PY" -c "import json, sys; print(json.load(open(sys.argv[1]))['http'])" "$OUT/ports")
    if "$PY" -c "import sys, urllib.request; urllib.request.urlopen(f'http://localhost:{sys.argv[1]}/v2/health/ready', timeout=2)" "$port" 2>/dev/null; then
      ready=1; break
    fi
  fi
  kill -0 "$server" 2>/dev/null || break
  sleep 2
done
if [ "$ready" = 1 ]; then
  say PASS "server ready in $(( $(date +%s) - start )) s"
else
  say FAIL "server not ready (log: $LOG)"; exit 1
fi

status=0
timeout 540 "$PY" - "$OUT/ports" "$PROJECT/tests/trtllm_standin/contract.json" "$DRY_RUN" <<'PY' || status=1
import json, sys, time, urllib.request

ports, contract_path, dry_run = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3] == "1"
base = f"http://localhost:{ports['http']}/v2/models"
failed = False
# Greedy output of an arm against the engine's own decoding of the same prompt. The stand-in is
# fp32 and exact: every prompt must match. An fp16 engine may not: the (gamma + 1)-token verify
# and the one-token step run different kernels, whose roundings can flip a near-tie between the
# two best tokens, after which the texts differ. Such flips are rare (a correct system matches
# most prompts, and diverges late); a wrong one (off-by-one, lost or invented tokens) diverges
# on most prompts, early. Required on a GPU: at least 4 of the 5 prompts exact per arm.
GREEDY_MIN_MATCH = 1.0 if dry_run else 0.8
MAX_TOKENS = 48 if dry_run else 96


def line(ok, name, detail):
    global failed
    failed |= ok is False
    print(f"{'INFO' if ok is None else 'PASS' if ok else 'FAIL':<6} {name}: {detail}", flush=True)


def check(name):
    """Run one check; an exception is its FAIL line (type and message, never a traceback)."""
    def wrap(fn):
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - the script's contract: a FAIL line per check
            line(False, name, f"{type(exc).__name__}: {exc}")
        return fn
    return wrap


def post(path, body):
    req = urllib.request.Request(f"{base}/{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as exc:
        raise RuntimeError(json.loads(exc.read() or b"{}").get("error", str(exc))) from None


try:
    from banditspec.text import prompt_ids
    from banditspec_client.triton_client import GenerationOptions, generate_http

    if ports["tokenizer"].startswith("model:"):
        from banditspec.engine.models import load_tokenizer

        tok = load_tokenizer(ports["tokenizer"][6:])
    else:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(ports["tokenizer"])
except Exception as exc:  # noqa: BLE001
    line(False, "set-up", f"{type(exc).__name__}: {exc}")
    sys.exit(1)

url = f"localhost:{ports['http']}"
prompts = [
    "Rewrite this function with type hints and keep the body unchanged:\n\ndef area(w, h):\n    return w * h\n",
    "Write a Python function that returns the n-th Fibonacci number.",
    "What are two good habits for writing clean code?",
    "List three colours: red, green, blue, red, green,",
    "Explain in two sentences what a hash map is.",
]


def target(tokens, n, draft=None, **flags):
    """The engine itself: one request to `target` (ids, perf figures)."""
    inputs = [
        {"name": "input_ids", "shape": [1, len(tokens)], "datatype": "INT32", "data": tokens},
        {"name": "input_lengths", "shape": [1, 1], "datatype": "INT32", "data": [len(tokens)]},
        {"name": "request_output_len", "shape": [1, 1], "datatype": "INT32", "data": [n]},
        {"name": "end_id", "shape": [1, 1], "datatype": "INT32", "data": [int(tok.eos_token_id)]},
        {"name": "return_perf_metrics", "shape": [1, 1], "datatype": "BOOL", "data": [True]},
    ]
    if draft:
        inputs.append({"name": "draft_input_ids", "shape": [1, len(draft)], "datatype": "INT32", "data": draft})
    names = ["output_ids", "sequence_length", "kv_cache_reused_blocks", "arrival_time_ns", "first_token_time_ns"]
    out = {o["name"]: o["data"] for o in post("target/infer", {"inputs": inputs, "outputs": [{"name": n} for n in names]})["outputs"]}
    out["tokens"] = out["output_ids"][: out["sequence_length"][0]]
    return out


native = {}


@check("engine's own decoding")
def _native():
    for p in prompts:
        t = time.perf_counter()
        out = target(prompt_ids(tok, p, chat=True), MAX_TOKENS)
        native[p] = {"text": tok.decode(out["tokens"], skip_special_tokens=True), "tokens": len(out["tokens"]),
                     "seconds": time.perf_counter() - t,
                     "ttft": (out["first_token_time_ns"][0] - out["arrival_time_ns"][0]) / 1e9}
    line(True, "engine's own decoding", f"{len(prompts)} prompts x {MAX_TOKENS} tokens, one request each")


def first_divergence(a, b):
    ta, tb = tok(a)["input_ids"], tok(b)["input_ids"]
    i = next((k for k in range(min(len(ta), len(tb))) if ta[k] != tb[k]), min(len(ta), len(tb)))
    return i


arms = ports["arms"].split(",")
for policy in ["vanilla"] + [f"fixed:{a}" for a in arms] + ["costaware", "ucbspec", "exp3spec", "uniform", "default"]:
    @check(f"greedy {policy} vs the engine's own decoding")
    def _greedy(policy=policy):
        if len(native) < len(prompts):
            raise RuntimeError("no reference (the engine's own decoding failed)")
        differ = []
        for p in prompts:
            opts = GenerationOptions(max_tokens=MAX_TOKENS, policy=None if policy == "default" else policy)
            text = generate_http(url, p, opts).text
            if text != native[p]["text"]:
                differ.append((p, first_divergence(text, native[p]["text"])))
        rate = 1 - len(differ) / len(prompts)
        detail = f"exact {len(prompts) - len(differ)}/{len(prompts)} (need {GREEDY_MIN_MATCH:.0%})"
        if differ:
            detail += f"; first divergence at token {differ[0][1]} of {differ[0][0][:30]!r}"
        line(rate >= GREEDY_MIN_MATCH, f"greedy {policy} vs the engine's own decoding", detail)


@check("sampling")
def _sampling():
    p = prompts[3]

    def sample(seed, policy="fixed:draft"):
        # fixed:draft: its drafts depend on the request alone (a replay sees the same drafts)
        return generate_http(url, p, GenerationOptions(max_tokens=16, policy=policy, temperature=0.9, seed=seed)).text

    s1, s1b, s2, s3 = sample(1), sample(1), sample(2), sample(3)
    ok = s1 == s1b and len({s1, s2, s3}) == 3 and s1 != native[p]["text"][: len(s1)]
    line(ok, "sampling", f"seed 1 repeats: {s1 == s1b}; seeds 1, 2, 3 differ: {len({s1, s2, s3}) == 3}; "
                         f"differs from greedy: {s1 != native[p]['text'][: len(s1)]}")


@check("KV reuse after the first step")
def _reuse():
    ids = tok(" ".join(["The quick brown fox jumps over the lazy dog."] * 40))["input_ids"][:200]
    first = target(ids, 1)
    second = target(ids + first["tokens"], 1)
    r0, r1 = first["kv_cache_reused_blocks"][0], second["kv_cache_reused_blocks"][0]
    line(r1 > 0, "KV reuse after the first step", f"kv_cache_reused_blocks {r0} -> {r1} ({len(ids)}-token prompt)")


@check("target: tokens after a rejection")
def _rejection():
    ids = prompt_ids(tok, prompts[1], chat=True)
    plain = target(ids, 5)["tokens"]
    draft = [plain[0], (plain[1] + 1) % len(tok), plain[2], plain[3]]
    got = target(ids, len(draft) + 1, draft)["tokens"]
    ok = got[:2] == plain[:2] and 2 <= len(got) <= len(draft) + 1 and got == plain[: len(got)]
    line(ok, "target: tokens after a rejection",
         f"{len(got)} tokens for 1 accepted of {len(draft)} (request_output_len {len(draft) + 1}); "
         f"{'decodes on after the correction' if len(got) > 2 else 'stops at the correction'}; all the engine's own: {got == plain[: len(got)]}")


@check("speed")
def _speed():
    generate_http(url, prompts[0], GenerationOptions(max_tokens=8))  # warm-up
    tokens = seconds = ttft = 0.0
    for p in prompts:
        r = generate_http(url, p, GenerationOptions(max_tokens=MAX_TOKENS, stream=True))
        tokens += r.stats.get("generated_tokens", 0)
        seconds += r.seconds
        ttft += r.first_token_seconds or 0.0
    n_tokens = sum(v["tokens"] for v in native.values())
    n_seconds = sum(v["seconds"] for v in native.values())
    n_ttft = sum(v["ttft"] for v in native.values())
    k = len(prompts)
    line(None, "speed", f"default policy {tokens / seconds:.1f} tokens/s, TTFT {1000 * ttft / k:.0f} ms; "
                        f"engine's own decoding {n_tokens / n_seconds:.1f} tokens/s ({tokens / seconds / (n_tokens / n_seconds):.2f}x), "
                        f"TTFT {1000 * n_ttft / k:.0f} ms (engine's first_token_time_ns - arrival_time_ns); "
                        f"{k} prompts x {MAX_TOKENS} tokens, one at a time")
    line(None, "upstream draft-target BLS", "not in this repository (its preprocessing/postprocessing models are not "
                                            "served here); compare with upstream's tensorrt_llm_bls by hand, docs/deploy.md")


@check("served target tensors == upstream table")
def _contract():
    contract = json.load(open(contract_path))
    fill = contract["template_values"]
    upstream = {t["name"]: fill.get(t["data_type"][2:-1], t["data_type"]) for t in contract["inputs"] + contract["outputs"]}
    with urllib.request.urlopen(f"{base}/target/config", timeout=30) as r:
        served = json.loads(r.read())
    declared = {t["name"] for t in served.get("output", [])}
    perf = ["kv_cache_alloc_new_blocks", "kv_cache_reused_blocks", "kv_cache_alloc_total_blocks", "arrival_time_ns",
            "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns", "acceptance_rate",
            "total_accepted_draft_tokens", "total_draft_tokens"]
    diff = [f"{t['name']} {t['data_type']}" for t in served.get("input", []) + served.get("output", []) if upstream.get(t["name"]) != t["data_type"]]
    missing = [n for n in perf if n not in declared]
    line(not diff and not missing, "served target tensors == upstream table",
         "all" if not diff and not missing else ", ".join(diff + [f"{n} not declared" for n in missing]))


sys.exit(1 if failed else 0)
PY
say INFO "total $(( $(date +%s) - start )) s; server log: $LOG"
exit $status
