#!/usr/bin/env bash
# The multi-process benchmark: Tessera's sharded data parallel and PyTorch FSDP / DDP, alternating.
#
#   bench/run_bench_dist.sh [--preset bench|tiny] [--steps 12] [--nproc 2] [--rounds 1]
#                           [--tessera build/release/bin/tessera] [--given] [--summary FILE]
#
# Each round runs, in this order, --nproc processes x 1 thread unless stated:
#   Tessera full_shard, PyTorch FSDP FULL_SHARD, Tessera shard_grad_op, PyTorch FSDP
#   SHARD_GRAD_OP, Tessera no_shard, PyTorch DDP, then Tessera 1 process x --nproc threads
#   (the same cores, no communication), and with --given the three PyTorch modes as given.
# Alternating keeps a slow drift of the machine (thermal, a neighbour's build) from landing on one
# implementation only. With several rounds each row's figures come from its median round by
# tokens/s.
#
# The PyTorch peer (bench/peers/torch_fsdp_bench.py) is run tuned (BENCHMARKS.md): OpenBLAS picks
# its own core type and tcmalloc keeps its activation buffers, set for the peer's command alone.
# --given adds the peer in the environment as given, for context (3-5x slower: minutes per mode).
# --summary FILE: also appends each mode's ratio to its tuned peer as JSON lines (bench/table.sh).
#
# Peak RSS per rank comes from the program's JSON (peak_rss_bytes_per_rank, else peak_rss_bytes),
# else from getrusage(RUSAGE_CHILDREN) in a small Python wrapper, which is the largest single
# descendant process's peak.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$root/bench/lib.sh"
preset=bench
steps=12
nproc=2
rounds=1
given=0
summary=
tessera=$root/build/release/bin/tessera
python=${PYTHON:-/usr/bin/python3}  # Debian's interpreter: the one with python3-torch
tcmalloc=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4
peer=$root/bench/peers/torch_fsdp_bench.py

usage() { sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "run_bench_dist: $*" >&2; exit 2; }

while (($#)); do
  case $1 in
    --preset) preset=${2:?--preset needs a value}; shift 2 ;;
    --steps) steps=${2:?--steps needs a value}; shift 2 ;;
    --nproc) nproc=${2:?--nproc needs a value}; shift 2 ;;
    --rounds) rounds=${2:?--rounds needs a value}; shift 2 ;;
    --tessera) tessera=${2:?--tessera needs a value}; shift 2 ;;
    --given) given=1; shift ;;
    --summary) summary=${2:?--summary needs a file}; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument '$1'" ;;
  esac
done
[[ $steps =~ ^[0-9]+$ && $nproc =~ ^[0-9]+$ && $rounds =~ ^[0-9]+$ ]] ||
  die "--steps, --nproc and --rounds take positive integers"
((steps >= 3 && nproc > 1 && rounds > 0)) || die "need --steps >= 3, --nproc >= 2, --rounds >= 1"
[[ -x $tessera ]] || die "Tessera binary '$tessera' not found or not executable (build it, or pass --tessera)"
[[ -x $python ]] || die "Python '$python' not found (set PYTHON to an interpreter with torch)"
[[ -r $tcmalloc ]] || die "$tcmalloc missing: the tuned peer needs Debian's libtcmalloc-minimal4 (scripts/setup.sh)"

work=$(mktemp -d "${TMPDIR:-/tmp}/tessera_bench_dist.XXXXXX")
trap 'rm -rf "$work"' EXIT

tuned_env=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "LD_PRELOAD=$tcmalloc" "OPENBLAS_NUM_THREADS=1")
# tessera_cmd STRATEGY / peer_cmd MODE: set the array `cmd` (nproc processes x 1 thread each).
tessera_cmd() {
  cmd=("$tessera" bench --preset "$preset" --steps "$steps" --nproc "$nproc"
    --set "parallel.strategy=$1" --set train.threads=1)
}
peer_cmd() {
  cmd=("$python" "$peer" --mode "$1" --nproc "$nproc" --threads 1 --preset "$preset" --steps "$steps")
}
tessera_single=("$tessera" bench --preset "$preset" --steps "$steps" --set "train.threads=$nproc")

# run NAME CMD...: stdout/stderr/peak RSS of one run into $work/NAME.{out,err,rss}.
run() {
  local name=$1
  shift
  echo "run_bench_dist: $name: $* (load average $(cut -d' ' -f1-3 /proc/loadavg))" >&2
  if ! "$python" -c '
import resource, subprocess, sys
rc = subprocess.call(sys.argv[2:])
with open(sys.argv[1], "w") as f:
    f.write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024))
sys.exit(rc)' "$work/$name.rss" "$@" >"$work/$name.out" 2>"$work/$name.err"; then
    echo "run_bench_dist: $name failed; last lines of its stderr and stdout:" >&2
    tail -n 20 "$work/$name.err" "$work/$name.out" >&2
    exit 1
  fi
}

# Row names: tessera.<strategy>, tuned.<mode>, given.<mode>, tessera.single.
pairs=("full_shard fsdp_full_shard" "shard_grad_op fsdp_shard_grad_op" "no_shard ddp")
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for ((r = 1; r <= rounds; r++)); do
  for pair in "${pairs[@]}"; do
    read -r strategy mode <<<"$pair"
    tessera_cmd "$strategy"
    run "tessera.$strategy.$r" "${cmd[@]}"
    peer_cmd "$mode"
    run "tuned.$mode.$r" "${tuned_env[@]}" "${cmd[@]}"
  done
  run "tessera.single.$r" "${tessera_single[@]}"
  if ((given)); then
    for pair in "${pairs[@]}"; do
      read -r _ mode <<<"$pair"
      peer_cmd "$mode"
      run "given.$mode.$r" "${cmd[@]}"
    done
  fi
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

commit=$(bench_commit "$root")
cpu=$(bench_cpu)

SUMMARY=$summary BENCH_DIR="$root/bench" WORK=$work ROUNDS=$rounds PRESET=$preset STEPS=$steps NPROC=$nproc GIVEN=$given COMMIT=$commit \
  CPU="$cpu ($(nproc) CPUs available)" LOAD="$load_before before, $load_after after" \
  TESSERA_CMD="$(tessera_cmd STRATEGY && echo "${cmd[*]}")" TESSERA_SINGLE_CMD="${tessera_single[*]}" \
  TUNED_CMD="${tuned_env[*]} $(peer_cmd MODE && echo "${cmd[*]}")" \
  GIVEN_CMD="$(peer_cmd MODE && echo "${cmd[*]}")" "$python" - <<'EOF'
"""Reads the runs' JSON lines and prints the side-by-side table and the ratios."""
import datetime
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.environ["BENCH_DIR"])
from bench_results import median_round, write_summary  # noqa: E402

env = os.environ
work, rounds, nproc = env["WORK"], int(env["ROUNDS"]), int(env["NPROC"])


def result(name):
    j = median_round(work, name, rounds, "run_bench_dist", "peak_rss_bytes_per_rank")
    if "first_loss" not in j and j.get("losses"):
        j["first_loss"] = j["losses"][0]
    return j


rows = [
    (f"Tessera full_shard {nproc}x1", "tessera.full_shard"),
    (f"PyTorch FULL_SHARD {nproc}x1", "tuned.fsdp_full_shard"),
    (f"Tessera shard_grad_op {nproc}x1", "tessera.shard_grad_op"),
    (f"PyTorch SHARD_GRAD_OP {nproc}x1", "tuned.fsdp_shard_grad_op"),
    (f"Tessera no_shard {nproc}x1", "tessera.no_shard"),
    (f"PyTorch DDP {nproc}x1", "tuned.ddp"),
    (f"Tessera 1x{nproc}", "tessera.single"),
]
if env["GIVEN"] == "1":
    rows += [(f"PyTorch FULL_SHARD as given", "given.fsdp_full_shard"),
             (f"PyTorch SHARD_GRAD_OP as given", "given.fsdp_shard_grad_op"),
             (f"PyTorch DDP as given", "given.ddp")]
res = {key: result(key) for _, key in rows}

print()
print(f"Tessera vs PyTorch, {nproc} processes: preset {env['PRESET']}, {env['STEPS']} steps per "
      f"run (median step time of steps 3..{env['STEPS']}), {rounds} round(s), alternating")
print(f"date     {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}")
print(f"machine  {env['CPU']}")
print(f"load     {env['LOAD']} (1/5/15-minute load averages)")
print(f"commit   {env['COMMIT']}")
print(f"threads  {nproc} processes x 1 thread (Tessera train.threads=1; PyTorch "
      f"torch.set_num_threads(1), OPENBLAS_NUM_THREADS=1 when tuned); Tessera 1x{nproc}: "
      f"train.threads={nproc}")
gemm = res["tessera.full_shard"].get("gemm")
if gemm:
    print(f"Tessera GEMM  {gemm}")
peer = res["tuned.ddp"]
core = peer.get("blas_corename")
print(f"PyTorch  torch {peer.get('torch_version', '?')}, BLAS {peer.get('blas', '?')}"
      + (f", OpenBLAS core {core}" if core else "")
      + "; Gloo over loopback; FSDP patched for CPU (see bench/peers/torch_fsdp_bench.py)")

print()
head = (f"{'implementation / mode':<32} {'tokens/s':>9} {'model GFLOP/s':>14} "
        f"{'median step s':>14} {'exposed comm s':>15} {'peak RSS/rank MB':>17} {'first loss':>11}")
print(head)
print("-" * len(head))
for label, key in rows:
    j = res[key]
    comm = j.get("exposed_comm_s")
    comm_s = f"{comm:>15.4f}" if isinstance(comm, (int, float)) else f"{'-':>15}"
    loss = j.get("first_loss")
    loss_s = f"{loss:>11.6f}" if isinstance(loss, (int, float)) else f"{'-':>11}"
    print(f"{label:<32} {j['tokens_per_s']:>9.1f} {j['model_flops_per_s'] / 1e9:>14.1f} "
          f"{j['median_step_s']:>14.4f} {comm_s} {j['peak_rss_bytes_per_rank'] / 1e6:>17.0f} "
          f"{loss_s}")
print("(exposed comm: Tessera's own measure; PyTorch FSDP: time blocked in its collectives, which "
      "on CPU do not overlap compute; DDP: not measured, its all-reduce runs on Gloo's threads)")
if rounds > 1:
    print()
    for label, key in rows:
        spread = ", ".join(f"{t:.1f}" for t in res[key]["all_tokens_per_s"])
        print(f"{label} tokens/s per round: {spread}")

print()
print("ratios (tokens/s)")
for label, a, b in (
        ("Tessera full_shard / PyTorch FULL_SHARD", "tessera.full_shard", "tuned.fsdp_full_shard"),
        ("Tessera shard_grad_op / PyTorch SHARD_GRAD_OP", "tessera.shard_grad_op",
         "tuned.fsdp_shard_grad_op"),
        ("Tessera no_shard / PyTorch DDP", "tessera.no_shard", "tuned.ddp"),
        (f"Tessera {nproc}x1 full_shard / Tessera 1x{nproc}", "tessera.full_shard",
         "tessera.single")):
    print(f"  {label:<48} {res[a]['tokens_per_s'] / res[b]['tokens_per_s']:>6.2f}x")

warnings = []
for key in ("params",):
    values = {k: j[key] for k, j in res.items()}
    if len(set(values.values())) > 1:
        warnings.append(f"{key} differs between runs: {values} (not the same model)")
dist_steps = {k: j["tokens_per_step"] for k, j in res.items() if k != "tessera.single"}
if len(set(dist_steps.values())) > 1:
    warnings.append(f"tokens_per_step differs between the {nproc}-process runs: {dist_steps}")
for k, j in res.items():
    if k.startswith("tessera.") and k != "tessera.single" and j.get("nproc", nproc) != nproc:
        warnings.append(f"{k} ran with nproc {j.get('nproc')}, not {nproc}")
ddp_loss = res["tuned.ddp"].get("first_loss")
for k in ("tuned.fsdp_full_shard", "tuned.fsdp_shard_grad_op"):
    loss = res[k].get("first_loss")
    if ddp_loss is not None and loss is not None and abs(loss - ddp_loss) > 1e-4:
        warnings.append(f"PyTorch {k[6:]} first loss {loss} differs from DDP's {ddp_loss}")
for w in warnings:
    print(f"warning: {w}")
for strategy, peer_mode, peer_name in (("full_shard", "fsdp_full_shard", "FSDP FULL_SHARD"),
                                       ("shard_grad_op", "fsdp_shard_grad_op", "FSDP SHARD_GRAD_OP"),
                                       ("no_shard", "ddp", "DDP")):
    write_summary(env["SUMMARY"], f"{strategy} vs {peer_name}, {nproc} x 1", res[f"tessera.{strategy}"],
                  res[f"tuned.{peer_mode}"])

print()
print("commands")
print(f"  Tessera {nproc}x1       {env['TESSERA_CMD']}  (STRATEGY: full_shard, shard_grad_op, "
      f"no_shard)")
print(f"  Tessera 1x{nproc}       {env['TESSERA_SINGLE_CMD']}")
print(f"  PyTorch tuned    {env['TUNED_CMD']}  (MODE: fsdp_full_shard, fsdp_shard_grad_op, ddp)")
if env["GIVEN"] == "1":
    print(f"  PyTorch as given {env['GIVEN_CMD']}")
EOF
