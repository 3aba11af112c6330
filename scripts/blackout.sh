#!/usr/bin/env bash
# How long a TCP connection stays silent after a network cut heals: the
# stall behind the slow recovery after "leader isolated" in the
# real-network test (docs/reliability.md, "On a real network").
#
#   scripts/blackout.sh 4 5 6              # one cut of each length, in seconds
#   SIDE=client scripts/blackout.sh 4 5 6  # the cut made in the client's namespace
#
# As root: a namespace "member" and a namespace "client" joined by a veth
# pair (10.78.0.1 and .2, which exist only there). The client sends 100
# bytes every 20 ms to the member; nft in the member's namespace drops
# every packet to and from the client for D seconds, as the test isolates a
# member (with SIDE=client, nft in the client's namespace, as the test cuts
# a holder off); then the cut is removed. It prints how long after the heal the
# member received the client's next bytes. The namespaces are removed at
# the end, however it ends. Needs ip, nft and python3.
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: $0 SECONDS..." >&2; exit 64; }
M=etcdlock-blackout-member C=etcdlock-blackout-client
case "${SIDE:-member}" in
  member) cutns=$M peer=10.78.0.2 ;;
  client) cutns=$C peer=10.78.0.1 ;;
  *) echo "SIDE: member or client" >&2; exit 64 ;;
esac
tmp=""
cleanup() {
  ip netns pids "$M" 2>/dev/null | xargs -r kill 2>/dev/null || true
  ip netns pids "$C" 2>/dev/null | xargs -r kill 2>/dev/null || true
  ip netns del "$M" 2>/dev/null || true
  ip netns del "$C" 2>/dev/null || true
  [ -z "$tmp" ] || rm -rf "$tmp"
}
trap cleanup EXIT
cleanup
tmp=$(mktemp -d -t etcdlock-blackout.XXXXXX)
ip netns add "$M"
ip netns add "$C"
ip link add bo-m type veth peer name bo-c
ip link set bo-m netns "$M"
ip link set bo-c netns "$C"
ip -n "$M" addr add 10.78.0.1/24 dev bo-m
ip -n "$C" addr add 10.78.0.2/24 dev bo-c
for ns in "$M" "$C"; do ip -n "$ns" link set lo up; done
ip -n "$M" link set bo-m up
ip -n "$C" link set bo-c up

for d in "$@"; do
  ip netns exec "$M" python3 -c '
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("10.78.0.1", 7000)); s.listen(1)
c, _ = s.accept()
with open(sys.argv[1], "w") as out:
    while True:
        b = c.recv(65536)
        if not b: break
        out.write("%.3f\n" % time.time())
' "$tmp/received" &
  member=$!
  sleep 0.3
  ip netns exec "$C" python3 -c '
import socket, sys, time
c = socket.create_connection(("10.78.0.1", 7000))
end = time.time() + float(sys.argv[1]) + 14  # past the cut and its heal
while time.time() < end:
    c.send(b"x" * 100); time.sleep(0.02)
c.close()
' "$(echo "$d + 14" | bc -l 2>/dev/null || python3 -c "print($d + 14)")" &
  client=$!
  sleep 2
  ip netns exec "$cutns" nft -f - <<NFT
table ip blackout {
  chain in { type filter hook input priority 0; ip saddr $peer drop; }
  chain out { type filter hook output priority 0; ip daddr $peer drop; }
}
NFT
  sleep "$d"
  ip netns exec "$cutns" nft delete table ip blackout
  heal=$(date +%s.%N)
  wait "$client" "$member"
  python3 -c '
import sys
heal, d = float(sys.argv[2]), sys.argv[3]
# heal is read just after nft returns: bytes may come a few ms before it.
after = [float(l) for l in open(sys.argv[1]) if float(l) > heal - 0.05]
print("cut of %5s s: the next bytes arrived %.2f s after the heal" % (d, after[0] - heal))
' "$tmp/received" "$heal" "$d"
done
