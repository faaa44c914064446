#!/usr/bin/env bash
# Gathered verify steps (banditspec.engine.gather) against the previous serving path, through a
# real tritonserver, settings alternated run by run (this VM's speed drifts between runs):
#   before:    verify_gather_us 0 (a request per step), target max_queue_delay_microseconds 2000
#   after:     the defaults (steps gathered by the controller, no queue delay)
#   nogather:  verify_gather_us 0 and no queue delay (why the controller must gather)
# Single stream: `banditspec bench --through-triton`, 6 code prompts, 64 tokens, 1 thread;
# the per-step gap between the controller's verify time and the target's own compute is printed.
# Concurrency: `banditspec bench-load` (plain decoding and pld at gamma 3, Triton gRPC).
#     bash experiments/ab_verify_gather.sh OUT [single|concurrency]
set -euo pipefail
OUT=${1:?output folder}; WHAT=${2:-single}
cd "$(dirname "$0")/.." && source .venv/bin/activate && mkdir -p "$OUT"
set_cfg() {  # verify_gather_us, target queue delay (us)
  sed -i -E "s/key: \"verify_gather_us\" value: \{ string_value: \"[0-9]+\" \}/key: \"verify_gather_us\" value: { string_value: \"$1\" }/" model_repository/banditspec/config.pbtxt
  sed -i -E "s/max_queue_delay_microseconds: [0-9]+/max_queue_delay_microseconds: $2/" model_repository/target/config.pbtxt
}
trap 'set_cfg 2000 0' EXIT
if [ "$WHAT" = single ]; then
  for rep in 1 2; do for method in vanilla costaware; do for cfg in "0 2000" "2000 0"; do
    set_cfg $cfg
    banditspec bench --through-triton --workload code --prompts 6 --methods $method --max-tokens 64 --threads 1 \
      --no-progress --out "$OUT/$method-$(echo $cfg | tr ' ' _)-$rep" > /dev/null
  done; done; done
  python - "$OUT" <<'PY'
import glob, json, statistics, sys
for f in sorted(glob.glob(sys.argv[1] + "/*/results.json")):
    recs = json.load(open(f))["records"]
    compute = sum(r["target_compute_ms"] for r in recs) / sum(r["target_calls"] for r in recs)
    verify = [v for r in recs for v in r["verify_ms"]]
    print(f.split("/")[-2], "target compute %.2f ms a call, verify %.2f ms a step, gap %.2f ms, median verify %.2f"
          % (compute, sum(verify) / len(verify), sum(verify) / len(verify) - compute, statistics.median(verify)))
PY
else
  for rep in 1 2; do for cfg in "0 2000" "2000 0"; do
    set_cfg $cfg
    banditspec bench-load --concurrency 2,4,8 --methods vanilla,pld@3 --transports triton --requests-per-stream 4 \
      --no-progress --out "$OUT/conc-$(echo $cfg | tr ' ' _)-$rep" > /dev/null
  done; done
fi
