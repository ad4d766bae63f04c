#!/usr/bin/env bash
# Runs Ferry's whole test suite: unit tests, spec round-trips, and the
# integration tests that start real ferry processes on loopback. Installs
# what the suite needs first.
set -euo pipefail
cd "$(dirname "$0")/../.."

# The dashboard's end-to-end test drives a real browser through WebDriver:
# Debian's chromium and its chromedriver.
if { [ -z "${CHROMIUM:-}" ] && [ ! -x /usr/bin/chromium ]; } ||
   { [ -z "${CHROMEDRIVER:-}" ] && [ ! -x /usr/bin/chromedriver ]; }; then
  echo "== installing chromium and chromium-driver (Debian packages) for the dashboard test"
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium chromium-driver >/dev/null
fi

# The real clients and servers the tests drive: nats-server (cluster
# tests), the OXP client and the ACP schema, the MCP SDK and conformance
# suite. Each installs only what is missing.
bash ops/scripts/install-nats.sh
bash ops/scripts/setup-oxp.sh  # OXP client venv (target/py) and ACP schema (target/acp)
bash ops/scripts/setup-mcp.sh  # MCP SDK (target/py), Node 22 + conformance suite (target/node)

# The integration tests spawn the ferry binary; build it (and everything
# else) before the tests run, so no test waits on a build.
start=$SECONDS
cargo build --workspace --bins --tests --quiet
echo "== built in $((SECONDS - start)) s"

# Two cores: integration tests spawn processes; four test threads keep the
# machine busy without starving the processes under test.
cargo test --workspace --no-fail-fast -- --test-threads="${FERRY_TEST_THREADS:-4}"
