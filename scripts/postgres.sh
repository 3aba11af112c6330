#!/usr/bin/env bash
# Starts a throwaway PostgreSQL for the fence package's tests and prints its
# connection string, for FENCE_POSTGRES:
#
#   export FENCE_POSTGRES=$(scripts/postgres.sh start)
#   (cd fence && go test ./...)
#   scripts/postgres.sh stop "$FENCE_POSTGRES"
#
# It installs the Debian package postgresql if no initdb is found (as root),
# and runs the server as the user postgres (or the caller, if not root) from
# a data directory of its own under ${TMPDIR:-/tmp}, named for its port (a
# free port of 127.0.0.1), with trust authentication: for tests only. Each
# start makes a server of its own; stop stops the one its connection string
# names.
set -euo pipefail

dir_of() { echo "${TMPDIR:-/tmp}/etcdlock-postgres-$1"; }

find_bin() {
  local b
  for b in /usr/lib/postgresql/*/bin; do
    [ -x "$b/initdb" ] && { echo "$b"; return 0; }
  done
  command -v initdb >/dev/null 2>&1 && { dirname "$(command -v initdb)"; return 0; }
  return 1
}

as_owner() {
  if [ "$(id -u)" = 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

case "${1:-}" in
start)
  if ! bin=$(find_bin); then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
      bin=$(find_bin)
    else
      echo "postgres.sh: no initdb, and cannot install postgresql (needs root and apt-get)" >&2
      exit 1
    fi
  fi
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null || echo $((40000 + $$ % 20000)))
  dir=$(dir_of "$port")
  rm -rf "$dir"
  mkdir -p "$dir"
  if [ "$(id -u)" = 0 ]; then chown postgres "$dir"; fi
  as_owner "$bin/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 >/dev/null
  as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/log" -w -t 60 \
    -o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c fsync=off -c max_connections=200" start >/dev/null
  echo "postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable"
  ;;
stop)
  port=$(echo "${2:-}" | sed -n 's#.*@127\.0\.0\.1:\([0-9]*\)/.*#\1#p')
  if [ -z "$port" ]; then
    echo "usage: $0 stop CONNECTION-STRING (as start printed it)" >&2
    exit 64
  fi
  dir=$(dir_of "$port")
  bin=$(find_bin) || exit 0
  if [ -d "$dir/data" ]; then as_owner "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null 2>&1 || true; fi
  rm -rf "$dir"
  ;;
*)
  echo "usage: $0 start | stop CONNECTION-STRING" >&2
  exit 64
  ;;
esac
