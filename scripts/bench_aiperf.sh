#!/usr/bin/env bash
# LLM load test with NVIDIA aiperf against `banditspec serve`'s OpenAI API (docs/benchmarks/aiperf/).
#   1. .venv/bin/banditspec serve            (OpenAI API on :9000)
#   2. bash scripts/bench_aiperf.sh [--url http://127.0.0.1:9000] [--concurrency 1,2,4,8] [...]
# aiperf gets its own virtual environment (.venv-aiperf): its pinned dependencies are not the server's.
set -euo pipefail
cd "$(dirname "$0")/.."
AIPERF_VERSION=0.13.0
if [ ! -x .venv-aiperf/bin/aiperf ]; then
  python3 -m venv .venv-aiperf
  .venv-aiperf/bin/python -m pip install --quiet "aiperf==${AIPERF_VERSION}"
fi
exec .venv/bin/python -m banditspec_client.bench.aiperf --aiperf .venv-aiperf/bin/aiperf "$@"
