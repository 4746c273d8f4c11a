#!/usr/bin/env bash
# Install what is missing, build, and run every test: the release build (unit, kernel, PyTorch
# parity and command-line tests), then the same tests under AddressSanitizer + UBSan, then each
# file parser's libFuzzer target for TESSERA_FUZZ_SECONDS (default 15) seconds (scripts/fuzz.sh).
# TESSERA_SKIP_SANITIZERS=1 skips the second and third passes (for quick local iterations only).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

scripts/build.sh release
ctest --preset release -j "$jobs"

if [[ "${TESSERA_SKIP_SANITIZERS:-0}" != 1 ]]; then
  scripts/build.sh asan
  ctest --preset asan -j "$jobs"
  scripts/fuzz.sh "${TESSERA_FUZZ_SECONDS:-15}"
fi
