#!/usr/bin/env bash
# Quick start: install what is missing, build, and train the default model (`tessera train`).
# Extra arguments go to `tessera train`, e.g. scripts/run.sh --set train.max_steps=50
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh release
exec build/release/bin/tessera train "$@"
