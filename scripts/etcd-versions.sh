#!/usr/bin/env bash
# Runs the family's guarantees against each etcd version the README names:
# for each nested module scripts/etcdserver/v3.N (its own go.mod pins
# go.etcd.io/etcd/server/v3 at the latest v3.N.x the Go module proxy served),
# starts that embedded etcd as a child process and runs a subset of the root
# package's tests against it through ETCDTEST_ENDPOINTS, then prints a table.
#
#   scripts/etcd-versions.sh              # about 2 minutes a version
#   UPDATE=1 scripts/etcd-versions.sh     # first move each module to the latest v3.N.x
#   KEEP=/tmp/logs scripts/etcd-versions.sh   # keep each version's test output there
#
# The subset: tests that run on etcdtest's (namespaced) clients. Left out are
# tests that dial Endpoints() themselves or inject faults in front of etcd
# (they read or write keys outside the namespace, or need a proxy of their
# own); tests needing an embedded etcd skip by themselves. Not part of .ci/run:
# too slow for its budget. Exit status 1 if any version failed a test.
set -euo pipefail
cd "$(dirname "$0")/.."

RUN='TestFamily|TestMutex|TestRWMutex|TestSemaphore|TestInspect|TestDo|TestLead|TestNamespacedLocks'
SKIP='^(TestRWMutexNoHerd|TestSemaphoreNoHerd|TestSemaphoreCrashedHolder|TestFamilyCancelAfterApply|TestLeadReportsSessionFailures)$'

tmp="$(mktemp -d -t etcd-versions.XXXXXX)"
logs="${KEEP:-$tmp}"
mkdir -p "$logs"
child=""
cleanup() {
  if [ -n "$child" ]; then kill -TERM "$child" 2>/dev/null || true; wait "$child" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

go test -c -o "$tmp/etcdlock.test" .

rows=()
status=0
for dir in scripts/etcdserver/v*/; do
  dir="${dir%/}"
  if [ -n "${UPDATE:-}" ]; then
    minor="${dir##*/}"
    latest="$(cd "$dir" && GOFLAGS=-mod=mod go list -m -versions go.etcd.io/etcd/server/v3 |
      tr ' ' '\n' | grep -E "^${minor//./\\.}\.[0-9]+$" | sort -V | tail -1)"
    (cd "$dir" && GOFLAGS=-mod=mod go get "go.etcd.io/etcd/server/v3@$latest" && go mod tidy)
  fi
  version="$(cd "$dir" && go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)"
  (cd "$dir" && go build -o "$tmp/etcd-$version" .)

  "$tmp/etcd-$version" >"$tmp/url" 2>"$logs/etcd-$version.log" &
  child=$!
  for _ in $(seq 600); do
    [ -s "$tmp/url" ] && break
    kill -0 "$child" 2>/dev/null || { echo "etcd $version did not start:" >&2; cat "$logs/etcd-$version.log" >&2; exit 1; }
    sleep 0.1
  done
  url="$(head -1 "$tmp/url")"
  echo "== etcd $version at $url" >&2

  out="$logs/test-$version.txt"
  start=$(date +%s)
  ETCDTEST_ENDPOINTS="$url" "$tmp/etcdlock.test" -test.run "$RUN" -test.skip "$SKIP" \
    -test.v -test.count 1 -test.timeout 10m >"$out" 2>&1 || status=1
  secs=$(( $(date +%s) - start ))

  kill -TERM "$child"
  wait "$child" || { echo "etcd $version did not exit cleanly:" >&2; cat "$logs/etcd-$version.log" >&2; status=1; }
  child=""

  # Top-level tests only: their result lines are not indented.
  pass=$(grep -c '^--- PASS' "$out" || true)
  fail=$(grep -c '^--- FAIL' "$out" || true)
  skip=$(grep -c '^--- SKIP' "$out" || true)
  if [ "$fail" -gt 0 ] || ! grep -q '^PASS$' "$out"; then
    status=1
    if [ -z "${KEEP:-}" ]; then kept="$(mktemp -t "etcd-versions-$version.XXXXXX")"; cp "$out" "$kept"; out="$kept"; fi
    echo "== etcd $version: failures (output in $out)" >&2
    grep -E '^\s*--- FAIL|_test\.go:[0-9]+:|^panic|^FAIL' "$out" >&2 || tail -40 "$out" >&2
  fi
  rows+=("| $version | $pass / $fail / $skip | ${secs}s |")
done

echo
echo "| etcd server | tests passed / failed / skipped | time |"
echo "|---|---|---|"
printf '%s\n' "${rows[@]}"
exit "$status"
