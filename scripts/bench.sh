#!/usr/bin/env bash
# Runs etcdlock's benchmarks next to concurrency.Mutex's on embedded etcd,
# then prints the table of medians and ratios (scripts/benchtable).
#
#   scripts/bench.sh                      # -count 3, -benchtime 1s: about 7 minutes
#   COUNT=5 BENCHTIME=2s scripts/bench.sh
#   OUT=bench.txt scripts/bench.sh        # keep the raw output (benchstat reads it too)
#   SVG=docs/bench scripts/bench.sh       # also draw waiting.svg and handoff.svg there
#   BENCH='Waiting|HeldLocks|Fsync' scripts/bench.sh   # only how cost grows: about 1.5 minutes a count
#
# Figures taken on a loaded machine are noisy: the load average is printed
# before and after the runs.
set -euo pipefail
cd "$(dirname "$0")/.."

COUNT="${COUNT:-3}"
BENCHTIME="${BENCHTIME:-1s}"
BENCH="${BENCH:-.}"
OUT="${OUT:-$(mktemp -t etcdlock-bench.XXXXXX)}"
SVG="${SVG:-}"

echo "== load before: $(uptime)" >&2
echo "== raw output: $OUT" >&2
{
  go test -run XXX -bench "$BENCH" -benchmem -count "$COUNT" -benchtime "$BENCHTIME" -timeout 60m .
  go test -run XXX -bench '^BenchmarkStart$' -benchmem -count "$COUNT" -benchtime "$BENCHTIME" -timeout 10m ./etcdtest
} | tee "$OUT" >&2
echo "== load after: $(uptime)" >&2
echo
go run ./scripts/benchtable ${SVG:+-svg "$SVG"} "$OUT"
