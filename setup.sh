#!/usr/bin/env bash
# Set up mlx-spec in ./.venv: the package, its dependencies and (on Linux) a fast BLAS for MLX's CPU backend.
# Usage: bash setup.sh [--dev]    (--dev adds the test dependencies)
set -euo pipefail
cd "$(dirname "$0")"
extras=""
[ "${1:-}" = "--dev" ] && extras="[dev]"

if [ "$(uname -s)" = "Linux" ] && ! ls /usr/lib/*-linux-gnu/openblas-pthread/libopenblas.so.0 >/dev/null 2>&1; then
  # MLX's Linux wheel links the reference BLAS; OpenBLAS makes float32 decoding ~3x faster.
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

if [ -n "$extras" ] && [ "$(uname -s)" = "Linux" ]; then
  # The web app's end-to-end test drives Debian's Chromium (Playwright's own browser download does not work here);
  # the terminal chat's test drives the real `mlx-spec chat` under tmux.
  dev_package chromium "the web app's browser test"
  dev_package tmux "the terminal chat's test"
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".${extras}"
echo "setup: done (.venv/bin/mlx-spec)"
