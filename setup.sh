#!/usr/bin/env bash
# Set up mlx-spec in ./.venv: the package, its dependencies and MLX's backend for this machine: Metal on macOS,
# CUDA on Linux with an NVIDIA GPU, else the CPU with a fast BLAS (OpenBLAS).
# Usage: bash setup.sh [--dev] [--refs] [--cpu] [--print]
#   --dev adds the test dependencies; --refs adds the PyTorch references of the slow interop tests (PyTorch's CPU
#   build, speculators, dflash); --cpu installs the CPU backend even where an NVIDIA GPU is;
#   --print prints the backend and the pip command, and installs nothing.
set -euo pipefail
cd "$(dirname "$0")"
dev=0 refs=0 cpu=0 print=0
for arg in "$@"; do
  case "$arg" in
    --dev) dev=1 ;;
    --refs) refs=1 ;;
    --cpu) cpu=1 ;;
    --print) print=1 ;;
    *) echo "setup: unknown option $arg (usage: bash setup.sh [--dev] [--refs] [--cpu] [--print])" >&2; exit 2 ;;
  esac
done

CUDA13_DRIVER=580        # MLX's install guide: its CUDA 13 wheel needs an NVIDIA driver >= 580
CUDA12_DRIVER=550.54.14  # and its CUDA 12 wheel >= 550.54.14

version_ge() {  # version_ge A B: is version A at least B?
  [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -n1)" = "$2" ]
}

nvidia_driver() {  # the NVIDIA driver's version as nvidia-smi prints it, or nothing
  local v
  command -v nvidia-smi >/dev/null || return 0
  v=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n1 | tr -d ' ') || true
  [[ "$v" =~ ^[0-9]+(\.[0-9]+)*$ ]] && echo "$v"  # its errors go to stdout too
  return 0
}

mlx_backend() {  # mlx_backend DRIVER: pyproject's extra with MLX's backend here: cpu, cuda13, cuda12 (macOS: none)
  [ "$(uname -s)" = "Linux" ] || return 0
  if [ "$cpu" = 1 ] || [ -z "$1" ]; then
    echo cpu
  elif version_ge "$1" "$CUDA13_DRIVER"; then
    echo cuda13
  elif version_ge "$1" "$CUDA12_DRIVER"; then
    echo cuda12
  else
    echo "setup: NVIDIA driver $1 is older than MLX's CUDA backend needs ($CUDA12_DRIVER): installing the CPU one" >&2
    echo cpu
  fi
}

driver=$(nvidia_driver)
backend=$(mlx_backend "$driver")
openblas=$([ "$backend" = cpu ] && echo yes || echo no)  # OpenBLAS serves MLX's CPU backend only
extras="$backend"
if [ "$dev" = 1 ]; then extras="${extras:+$extras,}dev"; fi
if [ "$refs" = 1 ]; then extras="${extras:+$extras,}refs"; fi
TORCH=2.13.0                                      # pyproject's refs extra pins the same
TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu  # PyTorch's CPU wheels (PyPI's Linux wheel is the CUDA build)
REFS_NO_DEPS="speculators==0.9.0 dflash==0.1.0"  # their pins would downgrade transformers: installed without them
target=".${extras:+[$extras]}"
if [ "$print" = 1 ]; then
  echo "backend: ${backend:-metal}"
  echo "openblas: $openblas"
  echo "pip install -e $target"
  if [ "$refs" = 1 ]; then
    if [ "$(uname -s)" = "Linux" ]; then echo "torch: pip install torch==$TORCH --index-url $TORCH_CPU_INDEX"; fi
    echo "no-deps: pip install --no-deps $REFS_NO_DEPS"
  fi
  exit 0
fi
case "$backend" in
  cuda*) echo "setup: NVIDIA driver $driver: MLX's CUDA backend, mlx[$backend] (--cpu installs the CPU one)" ;;
esac

if [ "$openblas" = yes ] && ! ls /usr/lib/*-linux-gnu/openblas-pthread/libopenblas.so.0 >/dev/null 2>&1; then
  # MLX's Linux CPU wheel links the reference BLAS; OpenBLAS makes float32 decoding ~3x faster.
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
    (apt-get update -qq && apt-get install -y -qq libopenblas0-pthread) >/dev/null 2>&1 \
      || echo "setup: could not install libopenblas0-pthread; mlx-spec will run with the slower reference BLAS"
  else
    echo "setup: for ~3x faster CPU decoding run: sudo apt-get install libopenblas0-pthread"
  fi
fi

dev_package() {  # dev_package CMD WHAT: install Debian's package CMD for a test that needs it, or say why not
  command -v "$1" >/dev/null && return 0
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$1") >/dev/null 2>&1 \
      || echo "setup: could not install $1; $2 will skip"
  else
    echo "setup: $2 needs $1: sudo apt-get install $1 (it skips without)"
  fi
}

if [ "$dev" = 1 ] && [ "$(uname -s)" = "Linux" ]; then
  # The web app's end-to-end test drives Debian's Chromium (Playwright's own browser download does not work here);
  # the terminal chat's test drives the real `mlx-spec chat` under tmux.
  dev_package chromium "the web app's browser test"
  dev_package tmux "the terminal chat's test"
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# MLX's Linux backends are separate wheels that write the same library: drop the one not chosen before installing.
for other in mlx-cpu mlx-cuda-13 mlx-cuda-12; do
  [ -n "$backend" ] && [ "$other" != "mlx-${backend/cuda/cuda-}" ] || continue
  if .venv/bin/python -m pip show -q "$other" >/dev/null 2>&1; then
    .venv/bin/python -m pip uninstall -q -y "$other"
  fi
done
if [ "$refs" = 1 ] && [ "$(uname -s)" = "Linux" ]; then  # the CPU wheel first: the refs extra's pin then holds
  # Where PyTorch's index cannot be reached (a mirror or a wheel folder only), pip retries each of its pages for
  # minutes before turning to the indexes it is configured with: ask once, and go to those at once.
  if .venv/bin/python - "$TORCH_CPU_INDEX/" >/dev/null 2>&1 <<'PY'; then
import sys, urllib.error, urllib.request
try:
    urllib.request.urlopen(sys.argv[1], timeout=10)
except urllib.error.HTTPError:
    pass  # it answered
PY
    .venv/bin/python -m pip install -q "torch==$TORCH" --index-url "$TORCH_CPU_INDEX"
  else
    echo "setup: $TORCH_CPU_INDEX unreachable: torch==$TORCH from pip's configured indexes (PyPI's is the CUDA build)"
    .venv/bin/python -m pip install -q "torch==$TORCH"
  fi
fi
.venv/bin/python -m pip install -q -e "$target"
if [ "$refs" = 1 ]; then
  # shellcheck disable=SC2086
  .venv/bin/python -m pip install -q --no-deps $REFS_NO_DEPS
fi
echo "setup: done (.venv/bin/mlx-spec)"
