#!/usr/bin/env bash
# Measures a package of N parallel tests (default 200), each taking and
# releasing an etcdlock.Mutex, two ways in one run: a server per test
# (etcdtest.Start) and one server shared by the package (etcdtest.Shared,
# a namespace per test). It generates both packages in a temporary
# directory of the module, compiles them first, and times the test
# binaries alone with /usr/bin/time -v: wall time and peak RSS.
#
#   scripts/bench-shared.sh               # 200 tests, -test.parallel = GOMAXPROCS
#   N=200 PARALLEL=16 scripts/bench-shared.sh
set -euo pipefail
cd "$(dirname "$0")/.."

N="${N:-200}"
PARALLEL="${PARALLEL:-}"
dir="$(mktemp -d ./etcdtest/benchshared.XXXXXX)"
trap 'rm -rf "$dir"' EXIT

gen() { # gen MODE: a package of N tests in $dir/MODE
  local mode=$1 pkg="$dir/$1"
  mkdir -p "$pkg"
  {
    cat <<GO
package bench_test

import (
	"os"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdtest"
)

func TestMain(m *testing.M) { os.Exit(etcdtest.Main(m).Run()) }

func client(t *testing.T) *clientv3.Client {
	if "$mode" == "shared" {
		return etcdtest.Shared(t).Client
	}
	return etcdtest.Start(t).Client(t)
}

func lockUnlock(t *testing.T) {
	t.Parallel()
	s, err := etcdlock.NewSession(client(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	m := etcdlock.NewMutex(s, "lock")
	if err := m.LockContext(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := m.UnlockContext(t.Context()); err != nil {
		t.Fatal(err)
	}
}
GO
    for i in $(seq 1 "$N"); do echo "func TestLock$i(t *testing.T) { lockUnlock(t) }"; done
  } >"$pkg/bench_test.go"
  go test -c -o "$dir/$mode.test" "$pkg"
}

for mode in per-test shared; do gen "$mode"; done
echo "== $(go version), $(nproc) cores, load: $(uptime)"
printf '| %-9s | %8s | %13s |\n' mode "wall (s)" "peak RSS (MiB)"
for mode in per-test shared; do
  out="$( (cd "$dir" && /usr/bin/time -v "./$mode.test" -test.count=1 ${PARALLEL:+-test.parallel="$PARALLEL"}) 2>&1)"
  grep -q '^PASS' <<<"$out" || { echo "$out"; exit 1; }
  wall="$(grep 'Elapsed (wall clock)' <<<"$out" | awk '{print $NF}')"
  rss="$(grep 'Maximum resident set size' <<<"$out" | awk '{print $NF}')"
  printf '| %-9s | %8s | %14.0f |\n' "$mode" "$wall" "$(echo "$rss/1024" | bc -l)"
done
