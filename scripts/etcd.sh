#!/usr/bin/env bash
# Runs a command against a throwaway etcd started from a binary of the
# system's, in a process of its own: ETCDTEST_ENDPOINTS names it while the
# command runs, and it is stopped and its data removed after, however the
# command ends. The exit status is the command's, or 1 if etcd did not start
# or did not stop cleanly.
#
#   scripts/etcd.sh go test -count=1 ./...
#
# The binary is $ETCD, /usr/bin/etcd unless set; without it, as root with
# apt-get, it installs the Debian package etcd-server (3.4.23 on Debian 12)
# and keeps the package's own service from starting. The server listens on
# 127.0.0.1 only, on free ports, with its data in a temporary directory:
# for tests only. scripts/etcd-versions.sh sources this file for etcd_start.
set -euo pipefail

ETCD="${ETCD-/usr/bin/etcd}"

# free_port prints a port of 127.0.0.1 that no one listened on a moment
# ago, below the kernel's ephemeral range: a port in that range can be the
# local end of any outgoing connection (the tests make thousands), which
# no probe sees and which makes etcd's bind fail. A race with other
# programs is still possible; etcd_start tries again when it loses one.
free_port() {
  local p low=32768
  read -r low _ </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || true
  [ "$low" -gt 11024 ] || low=32768
  while :; do
    p=$((10000 + RANDOM % (low - 10000)))
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
  done
}

# healthy PORT reports whether the etcd at 127.0.0.1:PORT says it is healthy
# (bash alone: no curl needed).
healthy() {
  local body
  body=$( (exec 3<>"/dev/tcp/127.0.0.1/$1" && printf 'GET /health HTTP/1.0\r\n\r\n' >&3 && timeout 5 cat <&3) 2>/dev/null) || return 1
  [[ $body == *'"health":"true"'* ]]
}

# etcd_install installs etcd-server if $ETCD is /usr/bin/etcd and missing.
etcd_install() {
  [ -x "$ETCD" ] && return
  if [ "$ETCD" != /usr/bin/etcd ] || [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "etcd.sh: no $ETCD, and cannot install etcd-server (needs root and apt-get)" >&2
    return 1
  fi
  # A policy-rc.d that exits 101 keeps the package's service from starting,
  # unless the system has a policy of its own.
  local policy=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    policy=/usr/sbin/policy-rc.d
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod +x "$policy"
  fi
  local rc=0
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server; } >&2 || rc=$?
  if [ -n "$policy" ]; then rm -f "$policy"; fi
  return "$rc"
}

# etcd_start DIR LOG starts $ETCD as a child of this shell, with its data in
# DIR and its log in LOG, and waits until it is healthy: it sets etcd_pid
# and etcd_url. A start that lost its ports to another program ("address
# already in use") is tried again on other ports, up to 5 times.
etcd_start() {
  local try
  for try in 1 2 3 4 5; do
    etcd_start_once "$@" && return 0
    grep -q 'address already in use' "$2" || break
    echo "etcd.sh: $etcd_url: ports taken (try $try of 5)" >&2
    rm -rf "$1"
  done
  echo "$ETCD did not start at $etcd_url:" >&2
  cat "$2" >&2
  return 1
}

etcd_start_once() {
  local dir="$1" log="$2" cport pport peer
  cport=$(free_port)
  pport=$(free_port)
  while [ "$pport" = "$cport" ]; do pport=$(free_port); done
  etcd_url="http://127.0.0.1:$cport" peer="http://127.0.0.1:$pport"
  "$ETCD" --name default --data-dir "$dir" \
    --listen-client-urls "$etcd_url" --advertise-client-urls "$etcd_url" \
    --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" \
    --initial-cluster "default=$peer" --logger zap --log-level error \
    </dev/null >"$log" 2>&1 &
  etcd_pid=$!
  for _ in $(seq 300); do
    healthy "$cport" && return 0
    kill -0 "$etcd_pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -TERM "$etcd_pid" 2>/dev/null || true
  wait "$etcd_pid" 2>/dev/null || true
  etcd_pid=""
  return 1
}

# etcd_stop stops the etcd of etcd_start and waits for it; it fails unless
# etcd exits cleanly: etcd re-raises SIGTERM once it has stopped (status 143).
etcd_stop() {
  [ -n "${etcd_pid:-}" ] || return 0
  local rc=0
  kill -TERM "$etcd_pid" 2>/dev/null || true
  wait "$etcd_pid" || rc=$?
  etcd_pid=""
  [ "$rc" -eq 0 ] || [ "$rc" -eq 143 ]
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  if [ $# -eq 0 ]; then
    echo "usage: $0 COMMAND [ARG...]" >&2
    exit 64
  fi
  etcd_install
  tmp="$(mktemp -d -t etcdlock-etcd.XXXXXX)"
  etcd_pid=""
  cleanup() {
    local rc=$?
    if ! etcd_stop; then
      echo "etcd.sh: $ETCD did not exit cleanly:" >&2
      cat "$tmp/log" >&2
      [ "$rc" -ne 0 ] || rc=1
    fi
    rm -rf "$tmp"
    exit "$rc"
  }
  trap cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  etcd_start "$tmp/data" "$tmp/log"
  echo "etcd.sh: $("$ETCD" --version | head -1) at $etcd_url" >&2
  ETCDTEST_ENDPOINTS="$etcd_url" "$@"
fi
