#!/usr/bin/env bash
# tessera report: the page of a real short run and of a fixture with every key of docs/metrics.md
# (2 ranks, MFU, evaluations, a checkpoint stall), each rendered by headless Chromium and checked
# (tests/report_check.py); errors name the file and line; a 100k-step run gives a bounded page.
# usage: report_test.sh TESSERA_BINARY
set -euo pipefail
tessera=$1
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
chromium=/usr/bin/chromium
[[ -x $chromium ]] || fail "$chromium not found (scripts/setup.sh installs it)"

# browse NAME PAGE: screenshot and DOM of PAGE into $tmp/NAME.png and $tmp/NAME.dom.
browse() {
  local flags=(--headless --disable-gpu --user-data-dir="$tmp/chrome-$1" --hide-scrollbars)
  [[ $(id -u) -ne 0 ]] || flags+=(--no-sandbox)  # Chromium refuses to run its sandbox as root
  timeout 60 "$chromium" "${flags[@]}" --screenshot="$tmp/$1.png" --window-size=1280,3000 "file://$2" \
    >"$tmp/$1.chrome.log" 2>&1 || { tail -5 "$tmp/$1.chrome.log"; fail "chromium screenshot of $2"; }
  timeout 60 "$chromium" "${flags[@]}" --dump-dom "file://$2" >"$tmp/$1.dom" 2>>"$tmp/$1.chrome.log" ||
    { tail -5 "$tmp/$1.chrome.log"; fail "chromium --dump-dom of $2"; }
  [[ -s $tmp/$1.png && -s $tmp/$1.dom ]] || fail "chromium wrote no screenshot or DOM for $2"
}
# REPORT_TEST_KEEP=DIR: keep the pages and screenshots there, to look at them.
keep() { [[ -z ${REPORT_TEST_KEEP:-} ]] || cp "$@" "$REPORT_TEST_KEEP/"; }
check() {  # check NAME PAGE RUN_DIR
  /usr/bin/python3 "$here/report_check.py" --page "$2" --dom "$tmp/$1.dom" --png "$tmp/$1.png" \
    --metrics "$3/metrics.jsonl" || fail "$1: the rendered page fails its checks (above)"
}

# 1. A real short run with what the binary writes today.
"$tessera" train "$here/../configs/tiny.toml" --set data.cache_dir="$tmp/cache" --set train.max_steps=30 \
  --run-dir "$tmp/run" >"$tmp/train.log" 2>&1 || { tail -20 "$tmp/train.log"; fail "training failed"; }
"$tessera" report "$tmp/run" || fail "report of the trained run"
[[ -s $tmp/run/report.html ]] || fail "no $tmp/run/report.html"
browse run "$tmp/run/report.html"
check run "$tmp/run/report.html" "$tmp/run"
echo "ok: trained run"

# 2. Every key: each plot's data path, escaping of run.json and config.toml text.
/usr/bin/python3 "$here/report_fixture.py" "$tmp/full" --steps 60 --world 2
"$tessera" report "$tmp/full" --out "$tmp/full.html" || fail "report of the fixture"
browse full "$tmp/full.html"
check full "$tmp/full.html" "$tmp/full"
grep -q '/data/&lt;fixture&gt; &amp; co' "$tmp/full.html" || fail "run.json text is not escaped"
grep -q '&lt;b&gt;not bold&lt;/b&gt;' "$tmp/full.html" || fail "config.toml text is not escaped"
grep -q 'rank 1 on' "$tmp/full.html" || fail "the straggler is not named"
keep "$tmp/run.png" "$tmp/run/report.html" "$tmp/full.png" "$tmp/full.html"
echo "ok: fixture with every key"

# 3. Errors: a corrupt line names file:line (exit 3, bad data); no metrics.jsonl; empty file; no RUN_DIR.
mkdir "$tmp/bad"
sed '7s/.*/{"step": 7, "loss": /' "$tmp/full/metrics.jsonl" >"$tmp/bad/metrics.jsonl"
rc=0
"$tessera" report "$tmp/bad" >"$tmp/bad.log" 2>&1 || rc=$?
cat "$tmp/bad.log"
[[ $rc -eq 3 ]] || fail "a corrupt line: exit $rc, want 3"
grep -q "bad/metrics.jsonl:7:" "$tmp/bad.log" || fail "the message does not name metrics.jsonl:7"
[[ ! -e $tmp/bad/report.html ]] || fail "a page was written for a corrupt metrics.jsonl"
mkdir "$tmp/empty"
rc=0
"$tessera" report "$tmp/empty" >"$tmp/empty.log" 2>&1 || rc=$?
[[ $rc -eq 3 ]] && grep -q "not a run directory: no metrics.jsonl" "$tmp/empty.log" ||
  { cat "$tmp/empty.log"; fail "a directory without metrics.jsonl: exit $rc"; }
: >"$tmp/empty/metrics.jsonl"
"$tessera" report "$tmp/empty" || fail "report of an empty metrics.jsonl"
grep -q "no steps recorded" "$tmp/empty/report.html" || fail "an empty metrics.jsonl gives no 'no steps recorded'"
rc=0
"$tessera" report >"$tmp/usage.log" 2>&1 || rc=$?
[[ $rc -eq 2 ]] && grep -q "usage: tessera report RUN_DIR" "$tmp/usage.log" ||
  { cat "$tmp/usage.log"; fail "tessera report without RUN_DIR: exit $rc, want 2 and the usage"; }
echo "ok: errors"

# 4. 100k steps, 4 ranks: the page stays small (downsampled) and is written in seconds.
/usr/bin/python3 "$here/report_fixture.py" "$tmp/long" --steps 100000 --world 4
start=$(date +%s.%N)
"$tessera" report "$tmp/long" || fail "report of 100k steps"
bytes=$(stat -c %s "$tmp/long/report.html")
echo "100k steps: $(stat -c %s "$tmp/long/metrics.jsonl") bytes of metrics.jsonl -> $bytes bytes of page in" \
  "$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s"
((bytes < 2000000)) || fail "the page of 100k steps has $bytes bytes (want < 2 MB)"
echo "PASS"
