#!/usr/bin/env bash
# Runs every fuzz target for N seconds each (default 60) on this machine's
# stable toolchain, then prints executions and findings per target.
#   fuzz/run-all.sh 600
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
export RUSTC_BOOTSTRAP=1
targets=(mcp_message tool_args queue_ops envelope relay_events)
for t in "${targets[@]}"; do
  cargo fuzz build --features libfuzzer "$t"
done
for t in "${targets[@]}"; do
  log="fuzz/artifacts/$t.log"
  mkdir -p fuzz/artifacts
  echo "== $t for ${seconds}s"
  # The committed corpus seeds the run; new inputs go to a scratch folder so the
  # committed corpus stays small (merge interesting ones by hand with -merge=1).
  mkdir -p "fuzz/artifacts/$t-corpus"
  status=0
  cargo fuzz run --features libfuzzer "$t" "fuzz/artifacts/$t-corpus" "fuzz/corpus/$t" -- \
    -max_total_time="$seconds" -print_final_stats=1 >"$log" 2>&1 || status=$?
  execs=$(grep -E '^stat::number_of_executed_units' "$log" | awk '{print $2}' | tail -1)
  echo "$t: ${execs:-?} executions, exit ${status}$( [ "$status" -ne 0 ] && echo ' (finding: see '"$log"')' )"
done
