#!/usr/bin/env bash
# Builds the libFuzzer targets of the file parsers (preset fuzz: clang, ASan + UBSan), writes their
# seed corpora, and runs each for SECONDS_PER_TARGET (default 30). Fails when any target finds a
# crash, a sanitizer report, an escaped exception, an allocation over the malloc limit, a hang
# or a failed property; the input is saved under build/fuzz/artifacts/.
#   scripts/fuzz.sh [SECONDS_PER_TARGET]
# TESSERA_FUZZ_TARGETS="safetensors config" runs only those.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}
build=build/fuzz

scripts/build.sh fuzz

# The corpus grows across local runs (build/fuzz/corpus/NAME); seeds are rewritten every time.
scratch=$(mktemp -d "${TMPDIR:-/tmp}/tessera-fuzz.XXXXXX")
if [[ -d /dev/shm && -w /dev/shm ]]; then scratch_base=$(mktemp -d /dev/shm/tessera-fuzz.XXXXXX); else scratch_base=$scratch; fi
trap 'rm -rf "$scratch" "$scratch_base"' EXIT
export TESSERA_FUZZ_TMPDIR=$scratch_base
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

mapfile -t targets < <(if [[ -n ${TESSERA_FUZZ_TARGETS:-} ]]; then tr ' ' '\n' <<<"$TESSERA_FUZZ_TARGETS"; else cat $build/fuzz/targets.txt; fi)
mkdir -p $build/artifacts
summary=()
failed=0
for t in "${targets[@]}"; do
  [[ -n $t ]] || continue
  bin=$build/fuzz/bin/${t}_fuzz
  seeds=$build/corpus/$t.seeds
  corpus=$build/corpus/$t
  rm -rf "$seeds"
  mkdir -p "$corpus"
  if ! "$bin" --write-seeds="$seeds"; then
    failed=1
    summary+=("$(printf '%-20s FAILED (cannot write its seeds)' "$t")")
    continue
  fi
  log=$scratch/$t.log
  echo "fuzz: $t for ${seconds}s ($(ls "$seeds" | wc -l) seeds, $(ls "$corpus" | wc -l) corpus inputs)"
  # -malloc_limit_mb: no input of a few KiB justifies a 64 MiB allocation, so a parser that
  # allocates what a header declares before checking it against the file is caught here.
  dict=(); [[ -f fuzz/$t.dict ]] && dict=(-dict="fuzz/$t.dict")
  rc=0
  "$bin" "${dict[@]}" -max_total_time="$seconds" -rss_limit_mb=2048 -malloc_limit_mb=64 -timeout=10 \
    -print_final_stats=1 -artifact_prefix="$build/artifacts/$t-" "$corpus" "$seeds" >"$log" 2>&1 || rc=$?
  # `|| true`: a finding while the corpus loads leaves no "cov:" line, and under pipefail the
  # failed grep would end the script before its report.
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | cut -d' ' -f2 || true)
  if ((rc == 0)); then
    summary+=("$(printf '%-20s ok     %9s runs  cov %5s  corpus %5s' "$t" "${runs:-?}" "${cov:-?}" "$(ls "$corpus" | wc -l)")")
  else
    failed=1
    artifact=$(grep -oE "Test unit written to [^ ]+" "$log" | tail -1 | cut -d' ' -f5 || true)
    summary+=("$(printf '%-20s FAILED (exit %d) %s' "$t" "$rc" "${artifact:-}")")
    echo "fuzz: $t failed; its report:"
    sed -n '/==FINDING==\|ERROR: \|runtime error/,$p' "$log" | grep -vE '^#[0-9]+' | head -80
    [[ -n ${artifact:-} ]] && echo "fuzz: reproduce with $bin $artifact"
  fi
done

echo
echo "fuzz summary (${seconds}s per target, ASan + UBSan, malloc limit 64 MiB):"
printf '  %s\n' "${summary[@]}"
exit $failed
