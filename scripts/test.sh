#!/usr/bin/env bash
# Install everything the tests need on a fresh machine, then lint, type-check and test.
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"
if ! command -v tmux >/dev/null; then
  $SUDO apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tmux >/dev/null
fi
# torch is pinned: 2.13.0 is the CPU build; an unpinned torch would pull gigabytes of CUDA.
python3 -m pip install -q torch==2.13.0 -e '.[test]'
python3 -m ruff check ablate tests scripts
python3 -m mypy ablate
python3 -m pytest -q "$@"
