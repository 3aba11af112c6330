#!/usr/bin/env bash
# Runs the real-network test (net_test.go): 3 etcd processes and 3 holder
# processes, each in a network namespace of its own, under partitions,
# loss, duplication, a slow link, pauses and kills. Needs root and network
# namespaces; says why and exits 0 where this machine cannot make them.
# Installs what it needs from Debian's packages: etcd-server (etcd 3.4.23,
# /usr/bin/etcd), nftables, iproute2.
#
#   scripts/net.sh                         # 1 minute of faults, -race, mutex
#   ETCDLOCK_NET=30m RACE= scripts/net.sh  # 30 minutes, without -race
#   ETCDLOCK_NET_ETCD=/path/to/etcd ETCDLOCK_NET_KINDS=mutex,semaphore-2 scripts/net.sh
#
# Afterwards it shows that nothing is left: no namespace, link or process
# of the run's (the test removes them; a run killed with SIGKILL leaves its
# namespaces, which the next run removes first).
set -euo pipefail
cd "$(dirname "$0")/.."

export ETCDLOCK_NET="${ETCDLOCK_NET:-1m}"
RACE="${RACE--race}"
probe=etcdlock-net-probe

skip() {
  echo "real-network run skipped: $1"
  exit 0
}
[ "$(id -u)" = 0 ] || skip "not root (network namespaces need CAP_SYS_ADMIN)"

missing=()
[ -x "${ETCDLOCK_NET_ETCD:-/usr/bin/etcd}" ] || missing+=(etcd-server)
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

echo "== ETCDLOCK_NET=$ETCDLOCK_NET go test $RACE -run '^TestNet\$' ."
start=$(date +%s)
status=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT
go test $RACE -count=1 -timeout 20m -run '^TestNet$' -v . >"$log" 2>&1 || status=$?
grep -E '^(---|ok|FAIL|PASS)|net_test.go|fault [0-9]+ at|seed|   (acquisitions|acknowledged|keys)' "$log" || true
[ "$status" -eq 0 ] || tail -80 "$log"
echo "took $(( $(date +%s) - start )) s"

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
