# Shared by the benchmark scripts (sourced): what a report says it ran on.

# The short commit of the tree at $1, marked when tracked files have uncommitted changes.
bench_commit() {
  local commit
  commit=$(git -C "$1" rev-parse --short HEAD 2>/dev/null || echo unknown)
  if [[ -n $(git -C "$1" status --porcelain --untracked-files=no 2>/dev/null) ]]; then
    commit+=" (with uncommitted changes)"
  fi
  echo "$commit"
}

# The CPU's model name, or "unknown".
bench_cpu() {
  local cpu
  cpu=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n 1)
  echo "${cpu:-unknown}"
}
