#!/usr/bin/env bash
# Set up (idempotent), start a real tritonserver with the BanditSpec models, send a few
# prompts through Triton and show outputs, per-arm statistics and speed against plain decoding.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/banditspec demo "$@"
