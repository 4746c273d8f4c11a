#!/usr/bin/env bash
# Install what is missing, build, and run every test: the release build (unit, kernel, PyTorch
# parity and command-line tests; the CUDA tests also under the CPU emulation of CUDA), then the
# same tests under AddressSanitizer + UBSan, then each file parser's libFuzzer target for
# TESSERA_FUZZ_SECONDS (default 10) seconds (scripts/fuzz.sh; scripts/nightly.sh fuzzes 120 s each).
# TESSERA_SKIP_SANITIZERS=1 skips the second and third passes (for quick local iterations only).
# Each stage's start and the seconds since the script began are printed ("== test.sh: ..."), so a
# CI log shows where its time goes (the budget: 45 minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
stage() { echo "== test.sh: $1 at $(date -u +%H:%M:%S), ${SECONDS} s in"; }

stage "release build"
scripts/build.sh release
stage "release ctest"
ctest --preset release -j "$jobs"
# The CUDA tests skip without a GPU; where the release build compiled them, they also run against
# the CPU emulation of CUDA and NCCL (tools/cuda_emu: the kernels, the model, the trainer, several
# GPUs over NCCL). CI leaves out three multi-GPU cases whose paths the others take (scripts/nightly.sh
# runs them all): shard_grad_op and no_shard on two GPUs (the collectives of full_shard and
# hybrid_shard), tensor parallelism with sequence parallelism on two (on four beside data parallelism).
if grep -q '^TESSERA_CUDA:BOOL=ON' build/release/CMakeCache.txt; then
  stage "the CUDA tests under the CPU emulation"
  GTEST_FILTER='-*SeveralGpusMatchOne/shard_grad_op_w2:*SeveralGpusMatchOne/no_shard_w2:*SeveralGpusMatchOne/full_shard_w2_tp2_sp' \
    tools/cuda_emu/run.sh
fi

if [[ "${TESSERA_SKIP_SANITIZERS:-0}" != 1 ]]; then
  stage "ASan + UBSan build"
  scripts/build.sh asan
  stage "ASan + UBSan ctest"
  ctest --preset asan -j "$jobs"
  stage "fuzz targets"
  scripts/fuzz.sh "${TESSERA_FUZZ_SECONDS:-10}"
fi
stage "done"
