#!/usr/bin/env bash
# Set up (idempotent) and run every test: unit, glue (pb_utils mocked), the real-model
# losslessness suite, and the integration tests against a real tritonserver.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest tests -q -p no:cacheprovider "$@"
