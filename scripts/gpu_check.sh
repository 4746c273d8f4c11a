#!/usr/bin/env bash
# The one prepared GPU check of the CUDA backend: `pack` builds a self-contained bundle here,
# `run OUT_DIR` runs it on the GPU machine and writes OUT_DIR/{gpu_check.log,summary.json}.
#
#   scripts/gpu_check.sh [pack]     here (no GPU needed): build, strip, fetch the .debs, size check
#   scripts/gpu_check.sh run OUT    there, from the repository root, with gpu_bundle/ carried
#
# The GPU machine has no network and a different image (Ubuntu, newer glibc and libstdc++, CUDA
# 13 and PyTorch with its NCCL), so the bundle carries the Debian packages of every shared
# library the binaries load except glibc, libstdc++, libgcc_s and the CUDA libraries, which the
# image's own serve (NCCL alone is 218 MB and could not travel). The packages are unpacked into a
# private prefix, never into /, and reach only the Tessera binaries (nvidia-smi and python3 keep
# the image's libraries).
#
# Exit codes: 0 all passed; 1 a step failed, or a test failed or was skipped; 2 usage; 3 build
# failed; 4 a library's package could not be found or fetched; 5 bundle too large; 6 no NVIDIA
# driver (nvidia-smi missing or sees no GPU); 7 bundle or a CUDA library missing on the GPU machine.
set -euo pipefail
export LC_ALL=C  # awk's and $EPOCHREALTIME's decimal point
cd "$(dirname "$0")/.."

readonly bundle=gpu_bundle
readonly max_bundle_bytes=$((48 * 1024 * 1024))  # the device tool carries 64 MiB with the tree
readonly max_travel_bytes=$((64 * 1024 * 1024))
readonly binaries=(tessera tessera_cuda_tests tessera_unit_tests tessera_attention_bench)  # unit tests: NCCL's
readonly prefix=/tmp/tessera-prefix
readonly budget_s=480  # the whole run: the device call's 600 s, less start-up and copies

usage() {
  cat >&2 <<EOF
usage: scripts/gpu_check.sh [pack]       build gpu_bundle/ here (the default)
       scripts/gpu_check.sh run OUT_DIR  run it on the GPU machine; results in OUT_DIR
EOF
  exit 2
}

die() {  # die CODE MESSAGE
  echo "gpu_check: error: $2" >&2
  exit "$1"
}

# ---------------------------------------------------------------------------------------------
# pack

# The owning package of a library path, as "name" (arch-qualified names lose the ":arch").
# dpkg's database may list a file under /lib or /usr/lib (merged /usr), so try both spellings
# of the path and of its target.
owner_of() {
  local p=$1 real candidates c out
  real=$(readlink -f "$p")
  candidates=("$p" "$real")
  for c in "$p" "$real"; do
    case $c in
      /usr/*) candidates+=("${c#/usr}") ;;
      *) candidates+=("/usr$c") ;;
    esac
  done
  for c in "${candidates[@]}"; do
    if out=$(dpkg -S "$c" 2>/dev/null); then
      out=${out%%: *}  # "pkg:amd64: /path" or "pkg1, pkg2: /path"
      out=${out%%,*}
      echo "${out%%:*}"
      return 0
    fi
  done
  return 1
}

# Fetches PACKAGE at VERSION into the current directory: apt's cache first, then the archive
# (`apt-get update` once, only after a failed download), else the candidate version of the same
# package (same soname, so the same ABI within a Debian release).
updated=0
fetch_deb() {
  local pkg=$1 ver=$2 arch=$3 cached sudo="" apt=(apt-get download -q)
  # As root apt hands the download to the user _apt, who may not write here: it warns, then works.
  if [[ $(id -u) -ne 0 ]]; then sudo=sudo; else apt+=(-o APT::Sandbox::User=root); fi
  cached=/var/cache/apt/archives/${pkg}_${ver//:/%3a}_${arch}.deb
  if [[ -f $cached ]]; then
    cp "$cached" .
    return 0
  fi
  "${apt[@]}" "$pkg:$arch=$ver" 2>/dev/null && return 0
  if ((updated == 0)); then
    echo "gpu_check: download of $pkg=$ver failed; running apt-get update once"
    $sudo apt-get update -q >/dev/null
    updated=1
    "${apt[@]}" "$pkg:$arch=$ver" 2>/dev/null && return 0
  fi
  echo "gpu_check: warning: $pkg=$ver is no longer in the archive; taking its candidate version" >&2
  "${apt[@]}" "$pkg:$arch"
}

pack() {
  scripts/setup.sh
  cmake --preset gpu >/dev/null || die 3 "cmake --preset gpu failed"
  cmake --build --preset gpu --target "${binaries[@]}" ||
    die 3 "cmake --build --preset gpu failed (src/kernels/cuda mid-edit?)"

  rm -rf "$bundle"
  mkdir -p "$bundle/bin" "$bundle/debs"
  local b
  for b in "${binaries[@]}"; do
    local built=build/gpu/bin/$b
    [[ -f $built ]] || built=build/gpu/src/$b  # tessera_unit_tests sits beside the sources
    cp "$built" "$bundle/bin/$b"
    strip "$bundle/bin/$b"
  done

  # Every library the binaries load (ldd lists the whole closure), by owning package.
  local arch line soname path pkg
  arch=$(dpkg --print-architecture)
  declare -A packages=() cuda_libs=()
  while read -r line; do
    [[ $line == *"=> not found"* ]] && die 4 "a library is missing here: $line"
    [[ $line =~ ^([^[:space:]]+)\ =\>\ (/[^[:space:]]+) ]] || continue  # vdso, the loader
    soname=${BASH_REMATCH[1]} path=${BASH_REMATCH[2]}
    case $soname in
      libcudart.so* | libcublas.so* | libcublasLt.so* | libnccl.so* | libcuda.so* | libnvidia-*)
        cuda_libs[$soname]=1
        continue
        ;;
    esac
    pkg=$(owner_of "$path") || die 4 "no Debian package owns $path ($soname)"
    case $pkg in
      libc6 | libstdc++6 | libgcc-s1) continue ;;  # the GPU image's newer ones serve
    esac
    packages[$pkg]=1
  done < <(for b in "${binaries[@]}"; do ldd "$bundle/bin/$b"; done)

  local ver
  {
    echo "# gpu_bundle: made by scripts/gpu_check.sh pack"
    echo "commit $(git describe --always --dirty 2>/dev/null || echo unknown)"
    echo "made $(date -u +%Y-%m-%dT%H:%M:%SZ) on ${HOSTNAME:-unknown}"
    echo "cuda $(/usr/local/cuda/bin/nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
  } >"$bundle/manifest.txt"
  for pkg in $(printf '%s\n' "${!packages[@]}" | sort); do
    ver=$(dpkg-query -W -f='${Version}' "$pkg:$arch")
    pushd "$bundle/debs" >/dev/null
    fetch_deb "$pkg" "$ver" "$arch" || die 4 "could not fetch $pkg=$ver"
    popd >/dev/null
  done
  local deb
  for deb in "$bundle"/debs/*.deb; do
    echo "deb $(dpkg-deb -f "$deb" Package) $(dpkg-deb -f "$deb" Version)" >>"$bundle/manifest.txt"
  done
  # The CUDA sonames the run must find in the GPU image (besides libcudart, libcublasLt, libnccl).
  printf '%s\n' "${!cuda_libs[@]}" | sort >"$bundle/cuda_libs.txt"

  # For the tokenizer step: Llama 3's, GPT-2's and Llama 2's tokenizer.json (setup.sh installed
  # them into build/tools) and the texts of tests/hf_tokenizer_check.mjs, gzipped (Python reads gzip).
  local models=build/tools/node_modules/@lenml name
  mkdir -p "$bundle/tokenizers"
  for name in llama3 gpt2 llama2; do
    [[ -s $models/tokenizer-$name/models/tokenizer.json ]] || die 4 "no $name tokenizer.json in build/tools: run scripts/setup.sh"
    gzip -9 -c "$models/tokenizer-$name/models/tokenizer.json" >"$bundle/tokenizers/$name.tokenizer.json.gz"
  done
  node tests/hf_tokenizer_check.mjs --write-texts "$bundle/tokenizers/texts.jsonl.gz" data/kjv.txt.zst ||
    die 4 "could not write the tokenizer texts (node)"

  local bytes tree
  bytes=$(du -sb "$bundle" | cut -f1)
  tree=$(git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- 2>/dev/null |
    tail -1 | cut -f1)
  echo
  echo "bundle contents:"
  (cd "$bundle" && du -b bin/* | awk '{printf "  %-28s %6.1f MiB\n", $2, $1 / 1048576}')
  echo "  debs/: ${#packages[@]} packages, $(du -sb "$bundle/debs" | awk '{printf "%.1f MiB", $1 / 1048576}')"
  local debs=("$bundle"/debs/*.deb)
  debs=("${debs[@]##*/}")
  echo "    ${debs[*]%%_*}"
  echo "  CUDA libraries taken from the GPU image: $(tr '\n' ' ' <"$bundle/cuda_libs.txt")"
  awk -v b="$bytes" -v t="$tree" 'BEGIN {
    printf "bundle: %.1f MiB (limit 48); with the working tree: %.1f MiB (limit 64)\n",
      b / 1048576, (b + t) / 1048576 }'
  ((bytes <= max_bundle_bytes)) || die 5 "gpu_bundle/ is $bytes bytes, over the 48 MiB limit"
  ((bytes + tree <= max_travel_bytes)) ||
    die 5 "gpu_bundle/ with the working tree is $((bytes + tree)) bytes, over the 64 MiB the device tool carries"

  cat <<'EOF'

Now make this device-tool call (run):
  command:   bash scripts/gpu_check.sh run "$OUT"
  carry:     ["gpu_bundle"]
  timeout_s: 600
EOF
}

# ---------------------------------------------------------------------------------------------
# run

steps_tsv=""  # name, exit code, seconds, gtest JSON or "-": one row per step
step_gtest_json=-  # set by gtest_step for the one step it runs
t0=$SECONDS

# step NAME TIMEOUT CMD...: runs CMD under `timeout` (clamped to what is left of the run's
# budget), logs it and records it for summary.json. A failing step does not stop the later ones.
# Bundle binaries need "${bundle_env[@]}" in front of them.
step() {
  local name=$1 limit=$2 gtest_json=$step_gtest_json left rc=0 start end
  step_gtest_json=-
  shift 2
  left=$((budget_s - (SECONDS - t0)))
  ((limit > left)) && limit=$left
  echo
  echo "=== step $name (timeout ${limit}s): $*"
  start=$EPOCHREALTIME
  if ((limit < 5)); then
    echo "no time left in the run's ${budget_s}s budget"
    rc=124
  else
    timeout --kill-after=10 "$limit" "$@" || rc=$?
  fi
  end=$EPOCHREALTIME
  local secs
  secs=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.2f", b - a }')
  echo "=== step $name: exit $rc after ${secs}s$( ((rc == 124)) && echo ' (timed out)')"
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$secs" "$gtest_json" >>"$steps_tsv"
}

# gtest_step NAME TIMEOUT CMD...: a step whose CMD is a gtest binary; its JSON report goes to
# OUT_DIR/NAME.json and its passed/failed/skipped counts into summary.json.
gtest_step() {
  local name=$1 limit=$2 json="$out/$1.json"
  shift 2
  step_gtest_json=$json
  step "$name" "$limit" "$@" "--gtest_output=json:$json"
}

# json_step NAME TIMEOUT CMD...: a step whose CMD prints one JSON line on stdout (tessera bench,
# the PyTorch peer), kept as OUT_DIR/NAME.json.
json_step() {
  local name=$1 limit=$2
  shift 2
  step "$name" "$limit" bash -c 'out=$1; shift; "$@" >"$out"; rc=$?; cat "$out"; exit $rc' _ "$out/$name.json" "$@"
}

# summary.json from the recorded steps; ERROR, when given, says why the run stopped early.
write_summary() {
  timeout 30 python3 - "$steps_tsv" "$out/summary.json" "${1:-}" <<'EOF'
import json, sys
steps_tsv, path, error = sys.argv[1:4]
steps, problems = [], [error] if error else []
for row in open(steps_tsv).read().splitlines():
    name, rc, secs, gtest_json = row.split("\t")
    step = {"name": name, "exit_code": int(rc), "seconds": float(secs)}
    if step["exit_code"]:
        problems.append(f"step {name} exited {rc}" + (" (timed out)" if rc in ("124", "137") else ""))
    if gtest_json != "-":
        tests = {"passed": 0, "failed": 0, "skipped": 0, "not_run": 0, "failed_names": []}
        try:
            report = json.load(open(gtest_json))
            for suite in report.get("testsuites", []):
                for t in suite.get("testsuite", []):
                    full = f'{suite["name"]}.{t["name"]}'
                    if t.get("failures"):
                        tests["failed"] += 1
                        tests["failed_names"].append(full)
                    elif t.get("result") == "SKIPPED":
                        tests["skipped"] += 1
                    elif t.get("status") == "RUN":
                        tests["passed"] += 1
                    else:
                        tests["not_run"] += 1  # DISABLED_ or filtered out
        except (OSError, ValueError) as e:  # crashed or timed out before writing it
            tests["error"] = f"no gtest report {gtest_json}: {e}"
        if "error" in tests:
            problems.append(f"step {name}: {tests['error']}")
        if tests["failed"]:
            problems.append(f"step {name}: {tests['failed']} tests failed")
        if tests["skipped"]:  # on the GPU machine a skip means the device was not seen
            problems.append(f"step {name}: {tests['skipped']} tests skipped (was the GPU seen?)")
        if not tests["passed"] and "error" not in tests:
            problems.append(f"step {name}: no test passed")
        step["tests"] = tests
    steps.append(step)
ok = not problems
summary = {"ok": ok, "problems": problems, "steps": steps}
open(path, "w").write(json.dumps(summary, indent=2) + "\n")
print(json.dumps(summary, indent=2))
sys.exit(0 if ok else 1)
EOF
}

# Stops the run early with CODE, still writing summary.json.
abort() {  # abort CODE MESSAGE
  echo "gpu_check: error: $2" >&2
  write_summary "$2" >/dev/null || true
  exit "$1"
}

# The directory holding SONAME in the GPU image: the CUDA toolkit, PyTorch's wheels, ldconfig.
find_image_lib() {
  local soname=$1 dir hit
  local dirs=(/usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda-*/lib64 /usr/local/cuda-*/lib)
  [[ -n $nvidia_py_dir ]] && dirs+=("$nvidia_py_dir")
  dirs+=(/usr/local/nvidia/lib64 /usr/local/nvidia/lib)
  for dir in "${dirs[@]}"; do
    [[ -d $dir ]] || continue
    hit=$(find -L "$dir" -maxdepth 4 -name "$soname" -print -quit 2>/dev/null)
    if [[ -n $hit ]]; then
      dirname "$hit"
      return 0
    fi
  done
  hit=$(ldconfig -p 2>/dev/null | awk -v s="$soname" '$1 == s && /x86-64/ { print $NF; exit }')
  [[ -n $hit ]] && dirname "$hit"
}

run_check() {
  steps_tsv=$(mktemp /tmp/gpu_check_steps.XXXXXX)
  echo "gpu_check run: $(date -u +%Y-%m-%dT%H:%M:%SZ) on ${HOSTNAME:-unknown}, output in $out"

  # Fail fast where there is no GPU (this machine, CI).
  PATH=$PATH:/usr/local/nvidia/bin
  command -v nvidia-smi >/dev/null || abort 6 "no NVIDIA driver: nvidia-smi not found (this is no GPU machine)"
  timeout 30 nvidia-smi -L || abort 6 "no NVIDIA driver: nvidia-smi sees no GPU"

  [[ -f $bundle/manifest.txt ]] ||
    abort 7 "no $bundle/ here: run scripts/gpu_check.sh pack first and name \"gpu_bundle\" in the call's carry"
  cat "$bundle/manifest.txt"

  # The bundled Debian packages, unpacked privately.
  rm -rf "$prefix"
  mkdir -p "$prefix"
  command -v dpkg >/dev/null || abort 7 "dpkg not found: cannot unpack $bundle/debs"
  local deb
  for deb in "$bundle"/debs/*.deb; do
    timeout 60 dpkg -x "$deb" "$prefix" || abort 7 "dpkg -x $deb failed"
  done
  local ld_dirs=() lib_dir
  mapfile -t ld_dirs < <(find "$prefix"/lib "$prefix"/usr/lib -name 'lib*.so*' -printf '%h\n' 2>/dev/null | sort -u)
  echo "bundled libraries: ${ld_dirs[*]}"

  # The CUDA libraries from the image (the driver's libcuda too, when ldconfig does not know it).
  nvidia_py_dir=$(timeout 30 python3 -c 'import nvidia; print(list(nvidia.__path__)[0])' 2>/dev/null || true)
  # libcublasLt.so.13 although ldd does not show it: the CUDA backend opens it (kernels/cuda/cublaslt.h).
  local soname cuda_sonames=(libcudart.so.13 libcublasLt.so.13 libnccl.so.2)
  [[ -s $bundle/cuda_libs.txt ]] && mapfile -t -O 3 cuda_sonames <"$bundle/cuda_libs.txt"
  for soname in $(printf '%s\n' "${cuda_sonames[@]}" | awk '!seen[$0]++'); do
    lib_dir=$(find_image_lib "$soname") || true
    [[ -n $lib_dir ]] || abort 7 "$soname not found in the GPU image (CUDA toolkit, ${nvidia_py_dir:-no python3 nvidia tree}, ldconfig)"
    echo "$soname: from $lib_dir"
    ld_dirs+=("$lib_dir")
  done
  if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
    lib_dir=$(find_image_lib libcuda.so.1) || true
    echo "libcuda.so.1: ${lib_dir:-not found (the CUDA runtime will report no device)}"
    [[ -n $lib_dir ]] && ld_dirs+=("$lib_dir")
  fi
  local ld_path
  ld_path=$(printf '%s\n' "${ld_dirs[@]}" | awk '!seen[$0]++' | paste -sd:)
  bundle_env=(env "LD_LIBRARY_PATH=$ld_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
  # For scripts that run a binary themselves: wrappers giving the bundle's libraries to it alone.
  local wrapped
  for wrapped in tessera tessera_attention_bench; do
    printf '#!/bin/sh\nexec env "LD_LIBRARY_PATH=%s" "%s" "$@"\n' "$ld_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
      "$PWD/$bundle/bin/$wrapped" >"$prefix/$wrapped"
    chmod +x "$prefix/$wrapped"
  done
  echo "LD_LIBRARY_PATH for the bundle: $ld_path"

  # Steps, most important first (each is cut to what is left of the budget). $out holds at most 8
  # files that come back: gpu_check.log, summary.json and one per step below that writes one.
  step nvidia-smi 30 nvidia-smi
  # shellcheck disable=SC2016  # expanded by the inner bash
  step ldd 30 "${bundle_env[@]}" bash -c \
    'rc=0; for b; do l=$(ldd "$b"); printf "%s:\n%s\n" "$b" "$l"; grep "not found" <<<"$l" && rc=1; done; exit $rc' \
    _ "$bundle"/bin/*
  step info 60 "${bundle_env[@]}" "$bundle/bin/tessera" info
  # The several-GPU tests fork their ranks, which cannot use CUDA once their parent has: in a process of
  # its own, after the others (it skips below two GPUs).
  gtest_step cuda_tests 240 "${bundle_env[@]}" "$bundle/bin/tessera_cuda_tests" --gtest_filter='-*OnGpus*'
  # The NCCL process group on this machine's GPUs (each rank a forked child): world size 1
  # always, two ranks where there are two GPUs.
  local nccl_tests='NcclGroup.WorldOneAllCollectives:NcclGroup.PeerThatNeverJoinsTimesOut'
  if (($(nvidia-smi -L 2>/dev/null | grep -c '^GPU') >= 2)); then nccl_tests='NcclGroup.*'; fi
  gtest_step nccl_tests 60 "${bundle_env[@]}" "$bundle/bin/tessera_unit_tests" --gtest_filter="$nccl_tests"
  step multi_gpu 240 "${bundle_env[@]}" "$bundle/bin/tessera_cuda_tests" --gtest_filter='*OnGpus*'
  # The 50-step loss curve of `tessera train` on the bundled default (bf16, learning the bundled
  # corpus: 8.4 -> 4.8 nats) on the GPU and on this machine's CPU, compared within the bf16 bound.
  local tessera=("${bundle_env[@]}" "$bundle/bin/tessera")
  # A rotary base other than transformers' default, and Llama 3.1's scaling of it (at an original
  # length of 64, so that at head dim 32 some frequencies are kept, some blended, some stretched),
  # so that the HF check below sees how transformers reads both.
  local curve=(train --set train.max_steps=50 --set parallel.param_dtype=bf16 --set train.eval_interval=0
    --set model.rope_theta=500000 --set model.rope_scaling=llama3 --set model.rope_original_seq_len=64)
  rm -rf /tmp/tessera-curve-cpu /tmp/tessera-curve-cuda
  step curve_cpu 120 "${tessera[@]}" "${curve[@]}" --set train.device=cpu --run-dir /tmp/tessera-curve-cpu
  # The GPU run serves Prometheus; a scraper keeps the last page that carries the GPU's DCGM
  # families (NVML read off the step loop) and checks their names and labels.
  # shellcheck disable=SC2016  # expanded by the inner bash
  step curve_cuda 60 bash -c '"$@" & pid=$!; python3 - "$0" "$pid" <<"PY" & scraper=$!
import os, sys, time, urllib.request
page, served, deadline = "", False, time.time() + 55
while time.time() < deadline and os.path.exists(f"/proc/{sys.argv[2]}"):  # while the run lives
    try:
        text = urllib.request.urlopen("http://127.0.0.1:9464/metrics", timeout=1).read().decode()
        served = True
        if "DCGM_FI_DEV_GPU_UTIL{" in text:
            page = text
    except OSError:
        if served:
            break  # the run has ended
    time.sleep(0.2)
open(sys.argv[1], "w").write(page)
PY
    wait $pid; rc=$?; wait $scraper; exit $rc' "$out/prometheus.txt" "${tessera[@]}" "${curve[@]}" \
    --set train.device=cuda --set metrics.prometheus_port=9464 --run-dir /tmp/tessera-curve-cuda
  step prometheus_dcgm 10 python3 -c '
import re, sys
page = open(sys.argv[1]).read()
need = ["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_XID_ERRORS"]
missing = [n for n in need if not re.search("^" + n + r"\{gpu=\"\d+\",UUID=\"GPU-[^\"]+\",pci_bus_id=\"[^\"]+\",device=\"nvidia\d+\",modelName=\"[^\"]+\",Hostname=\"[^\"]*\"\} [0-9.e+-]+$", page, re.M)]
print("\n".join(l for l in page.splitlines() if l.startswith("DCGM_FI_DEV_")))
print("missing or malformed:", missing or "none")
sys.exit(1 if missing else 0)' "$out/prometheus.txt"
  step curve_compare 20 python3 -c '
import json, sys
runs = [[json.loads(line) for line in open(d + "/metrics.jsonl")] for d in sys.argv[1:]]
device = json.load(open(sys.argv[2] + "/run.json"))["device"]
a, b = ([r["loss"] for r in run] for run in runs)
worst = max(abs(x - y) / x for x, y in zip(a, b))
rate = runs[1][-1]["tokens_per_s"]
gpu = runs[1][-1].get("gpu", {})  # NVML, read off the step loop
print(f"{len(a)} steps: loss {a[0]:.4f} -> {a[-1]:.4f} on the CPU, {b[0]:.4f} -> {b[-1]:.4f} on {device}; "
      f"largest relative difference {worst:.2e} (bound 1e-2); GPU tokens/s at step 50: {rate:.0f}; "
      f"NVML at step 50: {json.dumps(gpu)}")
sys.exit(0 if len(a) == len(b) == 50 and worst <= 1e-2 and device.startswith("cuda") and
         "gpu_util_pct" in gpu and "uuid" in gpu else 1)' \
    /tmp/tessera-curve-cpu /tmp/tessera-curve-cuda
  # The GPU-trained run exported to HF and read by transformers' LlamaForCausalLM on the GPU: its
  # log-probabilities of a greedy continuation against `tessera generate`'s.
  rm -rf /tmp/tessera-hf-check
  step hf_transformers 60 python3 tests/hf_transformers_check.py "$prefix/tessera" /tmp/tessera-curve-cuda \
    /tmp/tessera-hf-check --reference transformers --device cuda
  # Tessera's tokenizer.json against Hugging Face's Rust library (transformers' own tokenizers),
  # which only this image has: Llama 3's, GPT-2's and Llama 2's, every text of
  # tests/hf_tokenizer_check.mjs.
  step hf_tokenizers 60 python3 tests/hf_tokenizers_check.py "$prefix/tessera" "$bundle/tokenizers"
  # The health check's GPU verdict failed on purpose (XID 79 injected into the real reading): exit 4,
  # naming the GPU by its PCI bus id.
  # shellcheck disable=SC2016  # expanded by the inner bash
  step gpu_health_fault 30 bash -c 'TESSERA_FAULT=0:0:health:gpu "$@" 2>&1 | tee /tmp/tessera-health.log;
    rc=${PIPESTATUS[0]}; grep -q "XID 79 (GPU has fallen off the bus)" /tmp/tessera-health.log &&
    grep -qE "PCI [0-9A-Fa-f]+:[0-9A-Fa-f]+:" /tmp/tessera-health.log && [ "$rc" = 4 ]' _ \
    "${tessera[@]}" train --set train.max_steps=1 --set train.device=cuda --run-dir /tmp/tessera-health-fault
  # gpu-1b in bf16: Tessera (with three timed checkpoints: the stall is the device-to-host copy)
  # and the PyTorch eager peer on the same model and batch.
  json_step bench_gpu1b 150 "${tessera[@]}" bench --preset gpu-1b --steps 12 --set parallel.param_dtype=bf16 \
    --set train.device=cuda --checkpoint-dir /tmp/tessera-gpu-check-ckpt
  rm -rf /tmp/tessera-gpu-check-ckpt
  json_step peer_gpu1b 150 python3 bench/peers/torch_llama_bench.py --preset gpu-1b --steps 12 --dtype bf16 \
    --device cuda
  # Attention alone at gpu-1b's shape, beside PyTorch's scaled_dot_product_attention (into the log).
  step attention 60 bench/attention_gpu.sh "$prefix/tessera_attention_bench"
  # Where a gpu-1b step's time goes, op by op (each run alone, so the step is slower; into the log).
  step profile_gpu1b 120 "${tessera[@]}" bench --preset gpu-1b --steps 4 --profile-ops \
    --set parallel.param_dtype=bf16 --set train.device=cuda

  echo
  echo "=== summary ($((SECONDS - t0))s)"
  write_summary
}

run() {
  [[ $# -eq 1 && -n $1 ]] || usage
  mkdir -p "$1"
  out=$(cd "$1" && pwd)
  set +e
  run_check 2>&1 | tee "$out/gpu_check.log"
  local rc=${PIPESTATUS[0]}
  echo "gpu_check: exit $rc; results in $out/summary.json, log in $out/gpu_check.log"
  exit "$rc"
}

case ${1:-pack} in
  pack) [[ $# -le 1 ]] || usage; pack ;;
  run) shift; run "$@" ;;
  *) usage ;;
esac
