#!/usr/bin/env bash
# Builds tessera's CUDA sources (src/kernels/cuda/*.cu via transform.py, matmul.cc, cublaslt.cc, backend.cc)
# against the CPU emulation (emu_device.h, emu_runtime.cc; NCCL: emu_nccl.cc), links them with the
# repo's CPU/ref kernels and model (the release build's static libraries) and runs the CUDA test
# files (kernels, model, decoder, trainer, health, several GPUs over NCCL, the NCCL process group).
#
#   ./run.sh                 build (plain, -O2) and run every test
#   ./run.sh asan            the same under -fsanitize=address,undefined (emulation and CUDA sources)
#   ./run.sh build [asan]    build only
#   EMU_MODE=threads ./run.sh    one OS thread per CUDA thread instead of fibers
#   EMU_DEVICES=N ./run.sh       N emulated devices (default 4)
#   EMU_ORDER=reverse|random ./run.sh   fiber schedule order (default forward; EMU_SEED for random)
#   GTEST_FILTER=... ./run.sh         a subset
#   EMU_JOBS=N ./run.sh          N test files built and run at a time (default: the cores)
#   REPO=/path/to/checkout EMU_BUILD=/other/build ./run.sh   another tree (mutants), another build dir
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=${REPO:-$(cd "$HERE/../.." && pwd)}
REL=$REPO/build/release
VARIANT=plain
ACTION=all
for a in "$@"; do
  case $a in
    asan) VARIANT=asan ;;
    build) ACTION=build ;;
    *) echo "unknown argument $a" >&2; exit 2 ;;
  esac
done
OUT=${EMU_BUILD:-$REPO/build/cuda_emu}/$VARIANT
mkdir -p "$OUT"
CXXFLAGS=(-std=c++20 -g -fopenmp -ffp-contract=off -Wall -Wextra -Wno-unknown-pragmas -DFMT_SHARED -DGTEST_HAS_PTHREAD=1
  -DTESSERA_HAS_NCCL=1
  -I"$HERE" -I"$REPO/src" -I"$REL/generated" -isystem /usr/local/cuda/include)
LDFLAGS=()
if [[ $VARIANT == asan ]]; then
  CXXFLAGS+=(-O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined)
  LDFLAGS+=(-fsanitize=address,undefined)
else
  CXXFLAGS+=(-O2)
fi

compile() {  # src obj; also when any header of the tree is newer than obj (no dependency files here)
  if [[ ! -f $2 || $1 -nt $2 || $0 -nt $2 || -n $(find "$HERE" -name '*.h' -newer "$2" -print -quit) ||
    -n $(find "$REPO/src" \( -name '*.h' -o -name '*.cuh' \) -newer "$2" -print -quit) ]]; then
    echo "  c++ $(basename "$1")"
    g++ "${CXXFLAGS[@]}" -c "$1" -o "$2"
  fi
}

echo "== build ($VARIANT) in $OUT"
objs=()
for k in vector swiglu rope rms_norm embedding cross_entropy adamw attention attention_bf16 attention_cached device; do
  python3 "$HERE/transform.py" "$REPO/src/kernels/cuda/$k.cu" "$OUT/$k.cu.cc.new" 2>/dev/null
  if ! cmp -s "$OUT/$k.cu.cc.new" "$OUT/$k.cu.cc"; then mv "$OUT/$k.cu.cc.new" "$OUT/$k.cu.cc"; else rm "$OUT/$k.cu.cc.new"; fi
  compile "$OUT/$k.cu.cc" "$OUT/$k.cu.o" &
  objs+=("$OUT/$k.cu.o")
done
for f in kernels/cuda/matmul kernels/cuda/cublaslt kernels/cuda/backend; do
  compile "$REPO/src/$f.cc" "$OUT/$(basename $f).o" &
  objs+=("$OUT/$(basename $f).o")
done
compile "$HERE/emu_runtime.cc" "$OUT/emu_runtime.o" &
objs+=("$OUT/emu_runtime.o")
compile "$HERE/emu_nccl.cc" "$OUT/emu_nccl.o" &
objs+=("$OUT/emu_nccl.o")
compile "$REPO/src/comm/nccl_group.cc" "$OUT/nccl_group.o" &
objs+=("$OUT/nccl_group.o")
wait
# The release build's libraries under the trainer (tessera_train and what it links), as its link
# line names them, less the real CUDA runtime and cuBLASLt (emulated here).
train_libs() {
  local line
  line=$(grep -A3 "build bin/tessera:" "$REL/build.ninja" | grep -o "LINK_LIBRARIES = .*")
  for w in ${line#LINK_LIBRARIES = }; do
    case $w in
      src/libtessera_cli_lib.a | src/libtessera_launch.a | src/libtessera_plan.a | src/libtessera_cuda.a) ;;
      src/*.a) echo "$REL/$w" ;;
      *cudart* | *cublasLt* | *nccl* | -lcudadevrt | -Wl,-rpath*) ;;
      *) echo "$w" ;;
    esac
  done
}
mapfile -t TRAIN_LIBS < <(train_libs)
# The test files compile, link and run EMU_JOBS at a time (default: one per core; each emulated
# test is one OS thread, fibers, so two of them share two cores without slowing each other).
njobs=${EMU_JOBS:-$(nproc)}
throttle() { while (($(jobs -rp | wc -l) >= njobs)); do wait -n || true; done; }
# The emulated cuBLASLt is exported from each test, where cublaslt.cc looks first (the process's own).
build_test() {  # build_test SOURCE NAME
  compile "$REPO/src/$1.cc" "$OUT/$2.o" &&
    g++ "${LDFLAGS[@]}" -fopenmp -Wl,--export-dynamic-symbol='cublasLt*' -o "$OUT/$2" "$OUT/$2.o" "${objs[@]}" \
      -Wl,--start-group "${TRAIN_LIBS[@]}" -Wl,--end-group -lgtest_main -lgtest -ldnnl -lfmt -lpthread
}
tests=()
pids=()
# Longest first (about 120, 100, 30, 14, 7, 4, 1 and 1 s), so that two at a time end together.
for t in train/multi_gpu_cuda_test train/trainer_cuda_test kernels/cuda/attention_test model/llama_cuda_test comm/nccl_group_test \
  train/health_cuda_test kernels/cuda/cuda_vs_ref_test model/decoder_cuda_test; do
  n=$(basename $t)
  throttle
  build_test "$t" "$n" &
  pids+=($!)
  tests+=("$OUT/$n")
done
for p in "${pids[@]}"; do wait "$p" || { echo "cuda_emu: building a test failed (above)" >&2; exit 1; }; done
[[ $ACTION == build ]] && exit 0

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:detect_stack_use_after_return=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
run_test() {  # run_test BINARY: its output, timing and exit status in $OUT/logs/NAME.{log,rc}
  local n start=$SECONDS rc=0
  n=$(basename "$1")
  "$1" ${GTEST_FILTER:+--gtest_filter=$GTEST_FILTER} >"$OUT/logs/$n.log" 2>&1 || rc=$?
  echo "   ($((SECONDS - start)) s)" >>"$OUT/logs/$n.log"
  echo $rc >"$OUT/logs/$n.rc"
}
mkdir -p "$OUT/logs"
rm -f "$OUT"/logs/*.rc
for t in "${tests[@]}"; do
  throttle
  run_test "$t" &
done
wait
status=0
for t in "${tests[@]}"; do
  n=$(basename "$t")
  echo "== $n (EMU_MODE=${EMU_MODE:-fiber} EMU_ORDER=${EMU_ORDER:-forward})"
  cat "$OUT/logs/$n.log"
  [[ $(cat "$OUT/logs/$n.rc" 2>/dev/null) == 0 ]] || { echo "   FAILED: $n (exit $(cat "$OUT/logs/$n.rc" 2>/dev/null || echo '?'))"; status=1; }
done
exit $status
