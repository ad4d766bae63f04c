#!/usr/bin/env bash
# Installs what the OXP and ACP tests run: the official OXP Python client
# (with PyJWT and jsonschema) in the venv target/py, and the official ACP
# JSON Schema (the npm package @agentclientprotocol/sdk) in target/acp.
# Idempotent, and quick when everything is already there.
set -euo pipefail
cd "$(dirname "$0")/../.."

req=tests/py/requirements-oxp.txt
stamp=target/py/.installed-requirements-oxp
[ -x target/py/bin/python ] || python3 -m venv target/py
if ! cmp -s "$req" "$stamp"; then
  echo "== installing the OXP client into target/py"
  target/py/bin/pip install --quiet --disable-pip-version-check -r "$req"
  cp "$req" "$stamp"
fi

acp_version=2.4.0
schema=target/acp/node_modules/@agentclientprotocol/sdk/schema/v1/schema.json
installed=$(sed -n 's/^  "version": "\(.*\)",$/\1/p' \
  target/acp/node_modules/@agentclientprotocol/sdk/package.json 2>/dev/null || true)
if [ ! -f "$schema" ] || [ "$installed" != "$acp_version" ]; then
  echo "== installing the ACP schema package into target/acp"
  mkdir -p target/acp
  npm install --prefix target/acp --no-audit --no-fund --silent \
    "@agentclientprotocol/sdk@$acp_version"
fi
