#!/usr/bin/env bash
# The one benchmark command: Tessera and its PyTorch peer on the same model, alternating, side by side.
#
#   bench/run_bench.sh [--preset bench|tiny] [--steps 12] [--threads 2] [--rounds 1]
#                      [--dtype fp32|bf16] [--tessera build/release/bin/tessera] [--checkpoint]
#                      [--summary FILE]
#
# --checkpoint: each run then saves three checkpoints (params and AdamW state) into its temporary
# folder and reports the step loop's stall per save: Tessera's asynchronous sharded save beside
# PyTorch's synchronous torch.save of both state dicts (fsynced).
# --summary FILE: also appends the ratio to the tuned peer as one JSON line (bench/table.sh reads it).
#
# Each round runs, in this order: (a) Tessera, in the environment as given; (b) the PyTorch peer
# tuned; (c) the PyTorch peer as given. Alternating within a round keeps a slow drift of the
# machine (thermal, a neighbour's build) from landing on one implementation only. With several
# rounds each implementation's figures come from its median round by tokens/s.
#
# --dtype bf16 is mixed precision on both sides: Tessera with parallel.param_dtype=bf16 (bf16
# weight GEMMs, fp32 masters and optimizer) against the peer under torch.autocast("cpu",
# dtype=torch.bfloat16). Both keep norms, softmax and the loss in fp32 and accumulate in fp32.
#
# Tuned (BENCHMARKS.md): OpenBLAS picks its own core type (this machine's OPENBLAS_CORETYPE
# forces the slower Haswell kernel) and tcmalloc keeps PyTorch's activation buffers instead of
# handing them back to the OS every step. The tuning is set for the peer's command alone:
# Tessera does not use OpenBLAS and must not be credited or blamed for its settings.
#
# Peak RSS comes from the program's JSON when it reports peak_rss_bytes, else from
# getrusage(RUSAGE_CHILDREN) in a small Python wrapper (GNU time is not on every machine).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$root/bench/lib.sh"
preset=bench
steps=12
threads=2
rounds=1
checkpoint=0
dtype=fp32
summary=
tessera=$root/build/release/bin/tessera
python=${PYTHON:-/usr/bin/python3}  # Debian's interpreter: the one with python3-torch
tcmalloc=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4
peer=$root/bench/peers/torch_llama_bench.py

usage() { sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "run_bench: $*" >&2; exit 2; }

while (($#)); do
  case $1 in
    --preset) preset=${2:?--preset needs a value}; shift 2 ;;
    --steps) steps=${2:?--steps needs a value}; shift 2 ;;
    --threads) threads=${2:?--threads needs a value}; shift 2 ;;
    --rounds) rounds=${2:?--rounds needs a value}; shift 2 ;;
    --dtype) dtype=${2:?--dtype needs a value}; shift 2 ;;
    --tessera) tessera=${2:?--tessera needs a value}; shift 2 ;;
    --checkpoint) checkpoint=1; shift ;;
    --summary) summary=${2:?--summary needs a file}; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument '$1'" ;;
  esac
done
[[ $steps =~ ^[0-9]+$ && $threads =~ ^[0-9]+$ && $rounds =~ ^[0-9]+$ ]] ||
  die "--steps, --threads and --rounds take positive integers"
((steps > 0 && threads > 0 && rounds > 0)) || die "--steps, --threads and --rounds must be > 0"
[[ $dtype == fp32 || $dtype == bf16 ]] || die "--dtype takes fp32 or bf16"
[[ -x $tessera ]] || die "Tessera binary '$tessera' not found or not executable (build it, or pass --tessera)"
[[ -x $python ]] || die "Python '$python' not found (set PYTHON to an interpreter with torch)"
[[ -r $tcmalloc ]] || die "$tcmalloc missing: the tuned peer needs Debian's libtcmalloc-minimal4 (scripts/setup.sh)"

work=$(mktemp -d "${TMPDIR:-/tmp}/tessera_bench.XXXXXX")
trap 'rm -rf "$work"' EXIT

tessera_cmd=("$tessera" bench --preset "$preset" --steps "$steps" --set "train.threads=$threads"
  --set "parallel.param_dtype=$dtype")
peer_cmd=("$python" "$peer" --preset "$preset" --steps "$steps" --threads "$threads" --dtype "$dtype")
if ((checkpoint)); then
  tessera_cmd+=(--checkpoint-dir "$work/checkpoints-tessera")
  peer_cmd+=(--save-dir "$work/checkpoints-pytorch")
fi
tuned_env=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "LD_PRELOAD=$tcmalloc"
  "OPENBLAS_NUM_THREADS=$threads")

# run NAME CMD...: stdout/stderr/peak RSS of one run into $work/NAME.{out,err,rss}.
run() {
  local name=$1
  shift
  echo "run_bench: $name: $*" >&2
  if ! "$python" -c '
import resource, subprocess, sys
rc = subprocess.call(sys.argv[2:])
with open(sys.argv[1], "w") as f:
    f.write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024))
sys.exit(rc)' "$work/$name.rss" "$@" >"$work/$name.out" 2>"$work/$name.err"; then
    echo "run_bench: $name failed; last lines of its stderr and stdout:" >&2
    tail -n 20 "$work/$name.err" "$work/$name.out" >&2
    exit 1
  fi
}

for ((r = 1; r <= rounds; r++)); do
  run "tessera.$r" "${tessera_cmd[@]}"
  run "tuned.$r" "${tuned_env[@]}" "${peer_cmd[@]}"
  run "given.$r" "${peer_cmd[@]}"
done

commit=$(bench_commit "$root")
cpu=$(bench_cpu)

SUMMARY=$summary BENCH_DIR="$root/bench" WORK=$work ROUNDS=$rounds PRESET=$preset STEPS=$steps THREADS=$threads DTYPE=$dtype COMMIT=$commit \
  CPU="$cpu ($(nproc) CPUs available)" \
  TESSERA_CMD="${tessera_cmd[*]}" TUNED_CMD="${tuned_env[*]} ${peer_cmd[*]}" \
  GIVEN_CMD="${peer_cmd[*]}" "$python" - <<'EOF'
"""Reads the runs' JSON lines and prints the side-by-side table."""
import datetime
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.environ["BENCH_DIR"])
from bench_results import median_round, write_summary  # noqa: E402

env = os.environ
work, rounds = env["WORK"], int(env["ROUNDS"])


def result(name):
    return median_round(work, name, rounds, "run_bench", "peak_rss_bytes")


tessera, tuned, given = result("tessera"), result("tuned"), result("given")
rows = [("Tessera", tessera), ("PyTorch tuned", tuned), ("PyTorch as given", given)]

print()
print(f"Tessera vs PyTorch: preset {env['PRESET']}, {env['STEPS']} steps per run (median step "
      f"time of steps 3..{env['STEPS']}), {rounds} round(s), alternating")
if env["DTYPE"] == "bf16":
    print("precision bf16 mixed: Tessera parallel.param_dtype=bf16; PyTorch torch.autocast(\"cpu\", "
          "dtype=torch.bfloat16)")
else:
    print("precision fp32")
print(f"date     {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}")
print(f"machine  {env['CPU']}")
print(f"commit   {env['COMMIT']}")
print(f"threads  Tessera train.threads={env['THREADS']}; PyTorch torch.set_num_threads("
      f"{env['THREADS']}), OPENBLAS_NUM_THREADS={env['THREADS']} when tuned")
if "gemm" in tessera:
    print(f"Tessera GEMM  {tessera['gemm']}")
for label, j in (("tuned", tuned), ("as given", given)):
    blas = j.get("blas", "?")
    core = j.get("blas_corename")
    print(f"PyTorch {label:<8} torch {j.get('torch_version', '?')}, BLAS {blas}"
          + (f", OpenBLAS core {core}" if core else ""))

print()
head = (f"{'implementation':<18} {'tokens/s':>10} {'model GFLOP/s':>14} {'median step s':>14} "
        f"{'peak RSS MB':>12} {'Tessera/this':>13}")
print(head)
print("-" * len(head))
for name, j in rows:
    ratio = tessera["tokens_per_s"] / j["tokens_per_s"]
    print(f"{name:<18} {j['tokens_per_s']:>10.1f} {j['model_flops_per_s'] / 1e9:>14.1f} "
          f"{j['median_step_s']:>14.4f} {j['peak_rss_bytes'] / 1e6:>12.0f} {ratio:>12.2f}x")
if "save_stall_s" in tessera:
    print()
    head = (f"{'checkpoint save':<18} {'MB':>8} {'stall s':>9} {'to commit s':>12} "
            f"{'step during s':>14} {'stall: Tessera/this':>20}")
    print(head)
    print("-" * len(head))
    for name, j in rows:
        ratio = tessera["save_stall_s"] / j["save_stall_s"]
        print(f"{name:<18} {j['checkpoint_bytes'] / 1e6:>8.0f} {j['save_stall_s']:>9.3f} "
              f"{j['save_commit_s']:>12.3f} {j['step_s_during_save']:>14.3f} {ratio:>19.3f}x")
if rounds > 1:
    print()
    for name, j in rows:
        spread = ", ".join(f"{t:.1f}" for t in j["all_tokens_per_s"])
        print(f"{name} tokens/s per round: {spread}")

warnings = []
for name, j in rows:
    if "first_loss" in j or "losses" in j:
        first = j["losses"][0] if "losses" in j else j["first_loss"]
        last = j["losses"][-1] if "losses" in j else j["last_loss"]
        print(f"{name} loss: first {first:.6f}, last {last:.6f}")
for key in ("params", "tokens_per_step"):
    if tessera[key] != tuned[key]:
        warnings.append(f"{key} differs: Tessera {tessera[key]}, PyTorch {tuned[key]} "
                        f"(not the same model or batch: the ratio means little)")
if "blas_corename" not in tuned:
    warnings.append(f"the tuned peer did not run on OpenBLAS ({tuned.get('blas', '?')}); "
                    f"BENCHMARKS.md's tuned figures assume OpenBLAS (Debian libopenblas0), so "
                    f"this peer is slower than the one to beat")
for w in warnings:
    print(f"warning: {w}")
threads = env["THREADS"]
write_summary(env["SUMMARY"], f"{env['DTYPE']}, 1 process x {threads} threads", tessera, tuned)

print()
print("commands")
print(f"  Tessera          {env['TESSERA_CMD']}")
print(f"  PyTorch tuned    {env['TUNED_CMD']}")
print(f"  PyTorch as given {env['GIVEN_CMD']}")
EOF
