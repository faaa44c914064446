#!/usr/bin/env bash
# Set up (idempotent) and run the tests.
#   bash scripts/test.sh          every test but the long-form ones: unit, glue (pb_utils mocked), the
#                                 real-model losslessness suite, the integration tests against a real
#                                 tritonserver (short fuzzing); <= 15 minutes on 2 cores
#   bash scripts/test.sh --long   the long-form checks (docs/reliability.md, "Long-form checks"): the
#                                 tests marked `long` (the soak with 1000 requests, losslessness on every
#                                 prompt, the eagle stub's crash variants), fuzzing at length (3000
#                                 random examples per target) and a mutation run of the core's config
# Further arguments go to pytest (the fast form) or to both pytest runs (--long).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ "${1:-}" = "--long" ]; then
  shift
  BANDITSPEC_SOAK_REQUESTS=${BANDITSPEC_SOAK_REQUESTS:-1000} \
    .venv/bin/python -m pytest tests -q -p no:cacheprovider -m long "$@"
  BANDITSPEC_FUZZ_EXAMPLES=${BANDITSPEC_FUZZ_EXAMPLES:-3000} BANDITSPEC_FUZZ_RANDOM=${BANDITSPEC_FUZZ_RANDOM:-1} \
    .venv/bin/python -m pytest tests/integration/test_fuzz.py -q -p no:cacheprovider "$@"
  exec bash scripts/mutation.sh python_backend/banditspec/config.py 60 tests/unit/test_boundary_pins.py tests/unit/test_decoding.py
fi
exec .venv/bin/python -m pytest tests -q -p no:cacheprovider "$@"
