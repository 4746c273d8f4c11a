#!/usr/bin/env bash
# The whole CPU comparison in one command: every mode of issue 20's table, Tessera beside its
# tuned PyTorch peer, round after round, printed with the ratios.
#
#   bench/table.sh [--preset bench] [--steps 12] [--rounds 2] [--nproc 2] [--no-bf16]
#                  [--tessera build/release/bin/tessera] [--out DIR]
#
# Each round runs, in this order: fp32 at 1 process x NPROC threads (bench/run_bench.sh); the three
# sharded modes at NPROC processes x 1 thread against FSDP FULL_SHARD, SHARD_GRAD_OP and DDP
# (bench/run_bench_dist.sh); bf16 mixed precision at 1 x NPROC against torch.autocast
# (run_bench.sh --dtype bf16). Within each, Tessera and the peer alternate run by run. The
# table has one ratio column per round (Tessera tokens/s over the peer's, both from that round),
# and Tessera's MFU and exposed communication per step from the last round. Each script's own
# full report is kept in DIR (default: a new folder under /tmp), with the machine, the commit and
# the exact commands.
#
# A quiet machine matters: with the default 2 rounds of the `bench` preset this takes about
# 25 minutes on 2 cores; the load averages are printed before and after.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$root/bench/lib.sh"
preset=bench
steps=12
rounds=2
nproc=2
bf16=1
out=
tessera=$root/build/release/bin/tessera

usage() { sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "table: $*" >&2; exit 2; }

while (($#)); do
  case $1 in
    --preset) preset=${2:?--preset needs a value}; shift 2 ;;
    --steps) steps=${2:?--steps needs a value}; shift 2 ;;
    --rounds) rounds=${2:?--rounds needs a value}; shift 2 ;;
    --nproc) nproc=${2:?--nproc needs a value}; shift 2 ;;
    --no-bf16) bf16=0; shift ;;
    --tessera) tessera=${2:?--tessera needs a value}; shift 2 ;;
    --out) out=${2:?--out needs a folder}; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument '$1'" ;;
  esac
done
[[ $rounds =~ ^[0-9]+$ ]] && ((rounds > 0)) || die "--rounds takes a positive integer"
[[ -x $tessera ]] || die "Tessera binary '$tessera' not found or not executable (build it, or pass --tessera)"
out=${out:-$(mktemp -d "${TMPDIR:-/tmp}/tessera_table.XXXXXX")}
mkdir -p "$out"

common=(--preset "$preset" --steps "$steps" --tessera "$tessera")
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for ((r = 1; r <= rounds; r++)); do
  summary=$out/round$r.jsonl
  : >"$summary"
  echo "table: round $r of $rounds: fp32 1 x $nproc" >&2
  "$root/bench/run_bench.sh" "${common[@]}" --threads "$nproc" --summary "$summary" >"$out/fp32.$r.txt"
  echo "table: round $r of $rounds: $nproc processes (full_shard, shard_grad_op, no_shard)" >&2
  "$root/bench/run_bench_dist.sh" "${common[@]}" --nproc "$nproc" --summary "$summary" >"$out/dist.$r.txt"
  if ((bf16)); then
    echo "table: round $r of $rounds: bf16 1 x $nproc" >&2
    "$root/bench/run_bench.sh" "${common[@]}" --threads "$nproc" --dtype bf16 --summary "$summary" \
      >"$out/bf16.$r.txt"
  fi
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

commit=$(bench_commit "$root")
cpu=$(bench_cpu)
flags=$(grep -o -w -E 'avx512f|avx512_bf16|amx_bf16|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ')

OUT=$out ROUNDS=$rounds PRESET=$preset STEPS=$steps COMMIT=$commit CPU="$cpu ($(nproc) CPUs; $flags)" \
  LOAD="$load_before before, $load_after after" python3 - <<'EOF'
"""The rounds' summaries as one table: a row per mode, a ratio column per round."""
import json
import os

env = os.environ
rounds = int(env["ROUNDS"])
rows = {}  # mode -> [round's line]
for r in range(1, rounds + 1):
    with open(f"{env['OUT']}/round{r}.jsonl") as f:
        for line in f:
            j = json.loads(line)
            rows.setdefault(j["mode"], []).append(j)

print(f"Tessera / PyTorch (tuned), preset {env['PRESET']}, {env['STEPS']} steps per run, {rounds} round(s)")
print(f"machine  {env['CPU']}")
print(f"commit   {env['COMMIT']}")
print(f"load     {env['LOAD']} (1/5/15-minute load averages)")
print()
ratio_head = " | ".join(f"round {r}" for r in range(1, rounds + 1))
print(f"| mode | Tessera / PyTorch: {ratio_head} | Tessera tokens/s | PyTorch tokens/s | MFU | exposed comm s |")
print("|---|" + "---|" * (rounds + 4))
for mode, lines in rows.items():
    last = lines[-1]
    ratios = " | ".join(f"{j['ratio']:.2f}x" for j in lines)
    mfu = f"{100 * last['tessera_mfu']:.0f}%" if last.get("tessera_mfu") else "-"
    comm = last.get("tessera_exposed_comm_s")
    comm_s = f"{comm:.3f}" if isinstance(comm, (int, float)) and "process x" not in mode else "-"
    print(f"| {mode} | {ratios} | {last['tessera_tokens_per_s']:.1f} | {last['peer_tokens_per_s']:.1f} "
          f"| {mfu} | {comm_s} |")
print()
print(f"each script's full report (commands, peaks, losses): {env['OUT']}")
EOF
