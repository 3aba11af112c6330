#!/usr/bin/env bash
# Runs the real-network test (net_test.go): 3 etcd processes and 3 holder
# processes, each in a network namespace of its own, under partitions,
# loss, duplication, a slow link, pauses and kills. Needs root and network
# namespaces; says why and exits 0 where this machine cannot make them.
# Installs what it needs from Debian's packages: etcd-server (etcd 3.4.23,
# /usr/bin/etcd), nftables, iproute2. Versions 3.5 and later are etcd's own
# server command (scripts/etcdmain) built against
# scripts/etcdserver/v3.N/go.mod.
#
#   scripts/net.sh                         # 1 minute of faults, -race, mutex, etcd 3.4
#   ETCDLOCK_NET=30m RACE= scripts/net.sh  # 30 minutes, without -race
#   VERSIONS="3.4 3.5 3.6 3.7" ETCDLOCK_NET_KINDS=mutex,semaphore-2 scripts/net.sh
#   KEEP=/tmp/logs scripts/net.sh          # keep each version's test output there
#
# Afterwards it shows that nothing is left: no namespace, link or process
# of the run's (the test removes them; a run killed with SIGKILL leaves its
# namespaces, which the next run removes first).
set -euo pipefail
cd "$(dirname "$0")/.."

export ETCDLOCK_NET="${ETCDLOCK_NET:-1m}"
RACE="${RACE--race}"
VERSIONS="${VERSIONS:-3.4}"
probe=etcdlock-net-probe

skip() {
  echo "real-network run skipped: $1"
  exit 0
}
[ "$(id -u)" = 0 ] || skip "not root (network namespaces need CAP_SYS_ADMIN)"

missing=()
case " $VERSIONS " in *" 3.4 "*) [ -x /usr/bin/etcd ] || missing+=(etcd-server) ;; esac
command -v nft >/dev/null 2>&1 || missing+=(nftables)
command -v ip >/dev/null 2>&1 && command -v tc >/dev/null 2>&1 || missing+=(iproute2)
if [ "${#missing[@]}" -gt 0 ]; then
  if command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    skip "missing ${missing[*]} and no apt-get to install them"
  fi
fi

if ! err=$(ip netns add "$probe" 2>&1); then
  skip "this machine cannot make network namespaces: ip netns add: $err"
fi
nft_err=$(ip netns exec "$probe" nft add table ip etcdlock_net 2>&1) || true
ip netns del "$probe"
[ -z "$nft_err" ] || skip "nft cannot make tables in a namespace: $nft_err"

tmp=$(mktemp -d -t etcdlock-netrun.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
status=0
for version in $VERSIONS; do
  if [ "$version" = 3.4 ]; then
    bin=/usr/bin/etcd
  else
    # etcd's server command against this version's module, in a copy of
    # it: the build may add to its go.sum.
    mod="$tmp/build-$version"
    mkdir -p "$mod"
    cp "scripts/etcdserver/v$version/go.mod" "scripts/etcdserver/v$version/go.sum" scripts/etcdmain/main.go "$mod/"
    (cd "$mod" && GOFLAGS=-mod=mod go build -tags etcdmain -o "$tmp/etcd-$version" .)
    bin="$tmp/etcd-$version"
  fi
  echo "== etcd $version: ETCDLOCK_NET=$ETCDLOCK_NET go test $RACE -run '^TestNet\$' ."
  start=$(date +%s)
  log="${KEEP:-$tmp}/net-$version.txt"
  mkdir -p "$(dirname "$log")"
  ETCDLOCK_NET_ETCD="$bin" go test $RACE -count=1 -timeout 3h -run '^TestNet$' -v . >"$log" 2>&1 || { status=1; tail -80 "$log"; }
  grep -E '^(---|ok|FAIL|PASS)|net_test.go|fault [0-9]+ at|seed|   (acquisitions|acknowledged|keys)' "$log" || true
  echo "took $(( $(date +%s) - start )) s"
done

echo "== left behind (ip netns list, ip link, pgrep etcd):"
ns=$(ip netns list | grep etcdlock-net || true)
links=$(ip -o link | grep -E 'etcdlock|v-(m|c)[0-9]|v-obs' || true)
procs=$(pgrep -af -- '--initial-cluster-token etcdlock-net' || true)
echo "namespaces: ${ns:-none}"
echo "links: ${links:-none}"
echo "etcd processes of the run: ${procs:-none}"
echo "pgrep -a etcd (any owner):"; pgrep -a etcd || true
if [ -n "$ns$links$procs" ]; then
  echo "the run left something behind"
  status=1
fi
exit "$status"
