#!/usr/bin/env bash
# Runs the family's guarantees against each etcd version the README names:
# for each scripts/etcdserver/v3.N, a go.mod of its own that pins
# go.etcd.io/etcd/server/v3 at the latest v3.N.x the Go module proxy served,
# builds scripts/etcdserver/main.go against it, starts that embedded etcd as
# a child process and runs a subset of the root
# package's tests against it through ETCDTEST_ENDPOINTS, then prints a table.
# First, if there is one, the same against an etcd binary of the system's as
# the floor (ETCD, /usr/bin/etcd unless set; ETCD= to leave it out), such as
# Debian's etcd-server 3.4.23.
#
#   scripts/etcd-versions.sh              # about 1 minute a version
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
ETCD="${ETCD-/usr/bin/etcd}"
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

# run VERSION URL [LABEL]: runs the tests against the child etcd at URL,
# stops it, and adds a row for VERSION (or LABEL).
run() {
  local version="$1" url="$2" label="${3:-$1}" out="$logs/test-$1.txt" start secs pass fail skip kept rc
  echo "== etcd $version at $url" >&2
  start=$(date +%s)
  ETCDTEST_ENDPOINTS="$url" "$tmp/etcdlock.test" -test.run "$RUN" -test.skip "$SKIP" \
    -test.v -test.count 1 -test.timeout 10m >"$out" 2>&1 || status=1
  secs=$(( $(date +%s) - start ))

  # etcd's own binary re-raises SIGTERM once it has stopped: status 143.
  kill -TERM "$child"
  rc=0
  wait "$child" || rc=$?
  child=""
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 143 ]; then
    echo "etcd $version did not exit cleanly (status $rc):" >&2
    cat "$logs/etcd-$version.log" >&2
    status=1
  fi

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
  rows+=("| $label | $pass / $fail / $skip | ${secs}s |")
}

# A port nothing listens on (a race with other programs is possible).
free_port() {
  local p
  while :; do
    p=$((20000 + RANDOM % 40000))
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
  done
}

# The floor: an etcd binary of the system's, such as Debian's etcd-server
# (3.4.23), if there is one.
if [ -n "$ETCD" ] && [ -x "$ETCD" ]; then
  version="$("$ETCD" --version | sed -n 's/^etcd Version: */v/p')"
  cport=$(free_port) pport=$(free_port)
  url="http://127.0.0.1:$cport" peer="http://127.0.0.1:$pport"
  "$ETCD" --data-dir "$tmp/data" --listen-client-urls "$url" --advertise-client-urls "$url" \
    --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" \
    --initial-cluster "default=$peer" --logger zap --log-level error \
    >"$logs/etcd-$version.log" 2>&1 &
  child=$!
  for _ in $(seq 600); do
    curl -sf "$url/health" >/dev/null 2>&1 && break
    kill -0 "$child" 2>/dev/null || { echo "$ETCD did not start:" >&2; cat "$logs/etcd-$version.log" >&2; exit 1; }
    sleep 0.1
  done
  run "$version" "$url" "$version ($ETCD)"
fi

for dir in scripts/etcdserver/v*/; do
  dir="${dir%/}"
  if [ -n "${UPDATE:-}" ]; then
    minor="${dir##*/}"
    latest="$(cd "$dir" && GOFLAGS=-mod=mod go list -m -versions go.etcd.io/etcd/server/v3 |
      tr ' ' '\n' | grep -E "^${minor//./\\.}\.[0-9]+$" | sort -V | tail -1)"
  fi
  # The one program, scripts/etcdserver/main.go, built against this
  # version's go.mod in a directory of its own.
  mod="$tmp/mod-${dir##*/}"
  mkdir -p "$mod"
  cp "$dir/go.mod" "$dir/go.sum" scripts/etcdserver/main.go "$mod/"
  if [ -n "${UPDATE:-}" ]; then
    (cd "$mod" && GOFLAGS=-mod=mod go get "go.etcd.io/etcd/server/v3@$latest" && go mod tidy)
    cp "$mod/go.mod" "$mod/go.sum" "$dir/"
  fi
  version="$(cd "$mod" && go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)"
  (cd "$mod" && go build -o "$tmp/etcd-$version" .)

  "$tmp/etcd-$version" >"$tmp/url" 2>"$logs/etcd-$version.log" &
  child=$!
  for _ in $(seq 600); do
    [ -s "$tmp/url" ] && break
    kill -0 "$child" 2>/dev/null || { echo "etcd $version did not start:" >&2; cat "$logs/etcd-$version.log" >&2; exit 1; }
    sleep 0.1
  done
  run "$version" "$(head -1 "$tmp/url")"
done

echo
echo "| etcd server | tests passed / failed / skipped | time |"
echo "|---|---|---|"
printf '%s\n' "${rows[@]}"
exit "$status"
