#!/usr/bin/env bash
# Install what is missing, build, and run every test: the release build (unit, kernel, PyTorch
# parity and command-line tests), then the same tests under AddressSanitizer + UBSan.
# TESSERA_SKIP_SANITIZERS=1 skips the second pass (for quick local iterations only).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

scripts/build.sh release
ctest --preset release -j "$jobs"

if [[ "${TESSERA_SKIP_SANITIZERS:-0}" != 1 ]]; then
  scripts/build.sh asan
  ctest --preset asan -j "$jobs"
fi
