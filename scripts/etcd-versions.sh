#!/usr/bin/env bash
# Runs the family's guarantees against each etcd version the README names:
# for each scripts/etcdserver/v3.N, a go.mod of its own that pins
# go.etcd.io/etcd/server/v3 at the latest v3.N.x the Go module proxy served,
# builds scripts/etcdserver/main.go against it, starts that embedded etcd as
# a child process and runs a subset of the root
# package's tests against it through ETCDTEST_ENDPOINTS, then prints a table.
# First, if there is one, the same against an etcd binary of the system's as
# the floor (ETCD, /usr/bin/etcd unless set; ETCD= to leave it out), such as
# Debian's etcd-server 3.4.23, started as scripts/etcd.sh starts it.
#
#   scripts/etcd-versions.sh              # about 15 s a version, and the builds
#   ALL=1 scripts/etcd-versions.sh        # the whole quick suite, go test ./...: about 1 minute a version
#   UPDATE=1 scripts/etcd-versions.sh     # first move each module to the latest v3.N.x
#   KEEP=/tmp/logs scripts/etcd-versions.sh   # keep each version's test output there
#
# The subset: the family's guarantees, of the root package. With ALL=1, the
# quick suite of every package, as .ci/run runs it against Debian's
# etcd-server (and counts its top-level tests over all packages); tests that
# need an etcd of their own (auth on, member kills, etcdlock as a process)
# skip by themselves, saying why. Not part of .ci/run: too slow for its
# budget. Exit status 1 if any version failed a test.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/etcd.sh

RUN='TestFamily|TestMutex|TestRWMutex|TestSemaphore|TestInspect|TestDo|TestLead|TestNamespacedLocks'

tmp="$(mktemp -d -t etcd-versions.XXXXXX)"
logs="${KEEP:-$tmp}"
mkdir -p "$logs"
etcd_pid=""
cleanup() {
  etcd_stop || true
  rm -rf "$tmp"
}
trap cleanup EXIT

if [ -z "${ALL:-}" ]; then go test -c -o "$tmp/etcdlock.test" .; fi

rows=()
status=0

# run VERSION URL [LABEL]: runs the tests against the child etcd at URL,
# stops it, and adds a row for VERSION (or LABEL).
run() {
  local version="$1" url="$2" label="${3:-$1}" out="$logs/test-$1.txt" start secs pass fail skip kept trc=0
  echo "== etcd $version at $url" >&2
  start=$(date +%s)
  if [ -n "${ALL:-}" ]; then
    ETCDTEST_ENDPOINTS="$url" go test -count=1 -json -timeout 10m ./... >"$out" 2>&1 || trc=$?
  else
    ETCDTEST_ENDPOINTS="$url" "$tmp/etcdlock.test" -test.run "$RUN" \
      -test.v -test.count 1 -test.timeout 10m >"$out" 2>&1 || trc=$?
  fi
  secs=$(( $(date +%s) - start ))

  if ! etcd_stop; then
    echo "etcd $version did not exit cleanly:" >&2
    cat "$logs/etcd-$version.log" >&2
    status=1
  fi

  # Top-level tests only: with -json, the result lines whose test name has
  # no "/"; else, those not indented.
  if [ -n "${ALL:-}" ]; then
    local top='"Package":"[^"]*","Test":"[^"/]*",'
    pass=$(grep -c "\"Action\":\"pass\",$top" "$out" || true)
    fail=$(grep -c "\"Action\":\"fail\",$top" "$out" || true)
    skip=$(grep -c "\"Action\":\"skip\",$top" "$out" || true)
  else
    pass=$(grep -c '^--- PASS' "$out" || true)
    fail=$(grep -c '^--- FAIL' "$out" || true)
    skip=$(grep -c '^--- SKIP' "$out" || true)
  fi
  if [ "$fail" -gt 0 ] || [ "$trc" -ne 0 ]; then
    status=1
    if [ -z "${KEEP:-}" ]; then kept="$(mktemp -t "etcd-versions-$version.XXXXXX")"; cp "$out" "$kept"; out="$kept"; fi
    echo "== etcd $version: failures (output in $out)" >&2
    if [ -n "${ALL:-}" ]; then
      # The output of the failed tests, decoded from -json.
      grep -o '"Action":"fail","Package":"[^"]*","Test":"[^"]*"' "$out" | sed 's/.*"Test":"//; s/"$//' | sort -u |
        while read -r name; do grep -F "\"Test\":\"$name\"" "$out"; done |
        sed -n 's/.*"Output":"\(.*\)"}$/\1/p' | grep -E -e '--- FAIL|_test\.go:[0-9]+:|panic:' |
        while IFS= read -r line; do printf '%b' "$line"; done >&2 || tail -40 "$out" >&2
    else
      grep -E -e '--- FAIL|_test\.go:[0-9]+:|panic:|^FAIL' "$out" >&2 || tail -40 "$out" >&2
    fi
  fi
  rows+=("| $label | $pass / $fail / $skip | ${secs}s |")
}

# The floor: an etcd binary of the system's, such as Debian's etcd-server
# (3.4.23), if there is one.
if [ -n "$ETCD" ] && [ -x "$ETCD" ]; then
  version="$("$ETCD" --version | sed -n 's/^etcd Version: */v/p')"
  etcd_start "$tmp/data" "$logs/etcd-$version.log"
  run "$version" "$etcd_url" "$version ($ETCD)"
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
  etcd_pid=$!
  for _ in $(seq 600); do
    [ -s "$tmp/url" ] && break
    kill -0 "$etcd_pid" 2>/dev/null || { echo "etcd $version did not start:" >&2; cat "$logs/etcd-$version.log" >&2; exit 1; }
    sleep 0.1
  done
  run "$version" "$(head -1 "$tmp/url")"
done

echo
echo "| etcd server | tests passed / failed / skipped | time |"
echo "|---|---|---|"
printf '%s\n' "${rows[@]}"
exit "$status"
