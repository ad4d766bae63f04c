#!/usr/bin/env bash
# Runs Ferry's whole test suite: unit tests, spec round-trips, and the
# integration tests that start real ferry processes on loopback. Installs
# what the suite needs first.
set -euo pipefail
cd "$(dirname "$0")/../.."

# The integration tests spawn the ferry binary; build it (and everything
# else) before the tests run, so no test waits on a build.
cargo build --workspace --bins --tests --quiet

# Two cores: integration tests spawn processes; four test threads keep the
# machine busy without starving the processes under test.
cargo test --workspace --no-fail-fast -- --test-threads="${FERRY_TEST_THREADS:-4}"
