"""Drives Ferry's /mcp with the official MCP Python SDK and prints what it
saw as one JSON object on stdout, for the Rust integration tests to check.

    python mcp_client.py URL MODE SCENARIO [GROUP_ID] [--bearer TOKEN]

MODE is the SDK's connect mode: "auto" (probe server/discover, fall back to
initialize) or "legacy" (the initialize handshake); "future" is "auto" with
the SDK told that its newest stateless revision is one Ferry does not speak,
so that its probe fails and it falls back to initialize. SCENARIO:

- basic: list every tool (following cursors), call echo, call fail, call
  echo with invalid arguments, call an unknown tool.
- gated: call drop_table in thread GROUP_ID with a progress callback; the
  test decides the approval while this waits.
- list: list every tool (following cursors), and call drop_table, which
  the credential may not call.

--bearer TOKEN sends `Authorization: Bearer TOKEN` with every request.
"""

import asyncio
import json
import sys

from mcp import Client
from mcp.shared.exceptions import MCPError


def dump(result):
    return result.model_dump(by_alias=True, mode="json", exclude_none=True)


async def list_all(client):
    tools, pages, cursor = [], 0, None
    while True:
        page = await client.list_tools(cursor=cursor)
        pages += 1
        tools.extend(dump(t) for t in page.tools)
        cursor = page.next_cursor
        if not cursor:
            return tools, pages


async def basic(client, out):
    out["tools"], out["pages"] = await list_all(client)
    out["echo"] = dump(await client.call_tool("echo", {"text": "hello from mcp"}))
    out["fail"] = dump(await client.call_tool("fail", {"message": "boom"}))
    out["invalid"] = dump(await client.call_tool("echo", {"txt": 1}))
    try:
        await client.call_tool("no_such_tool", {})
        out["unknown"] = None
    except MCPError as e:
        out["unknown"] = {"code": e.code, "message": e.error.message}


async def listed(client, out):
    out["tools"], out["pages"] = await list_all(client)
    try:
        out["drop_table"] = dump(await client.call_tool("drop_table", {"table": "t"}))
    except MCPError as e:
        out["drop_table"] = {"code": e.code, "message": e.error.message}


async def gated(client, out, group_id):
    progress = []

    async def on_progress(value, total, message):
        progress.append({"progress": value, "message": message})
        # Tell the test the call waits: it decides the approval then.
        print(json.dumps({"waiting": message}), flush=True)

    result = await client.call_tool(
        "drop_table",
        {"table": "users"},
        progress_callback=on_progress,
        meta={"io.ferry/group_id": group_id, "io.ferry/user_id": "mcp-user"},
    )
    out["result"] = dump(result)
    out["progress"] = progress


def pretend_a_future_revision():
    from mcp.client import _probe

    _probe.LATEST_MODERN_VERSION = "2099-01-01"
    _probe.MODERN_PROTOCOL_VERSIONS = ("2099-01-01",)


async def main():
    args = sys.argv[1:]
    bearer = None
    if "--bearer" in args:
        at = args.index("--bearer")
        bearer = args[at + 1]
        del args[at : at + 2]
    url, mode, scenario = args[0:3]
    if mode == "future":
        pretend_a_future_revision()
        mode = "auto"
    server = url
    if bearer is not None:
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        headers = {"Authorization": f"Bearer {bearer}"}
        server = streamable_http_client(url, http_client=httpx2.AsyncClient(headers=headers))
    out = {}
    async with Client(server, mode=mode) as client:
        out["protocol_version"] = client.protocol_version
        out["server"] = dump(client.server_info) if client.server_info else None
        if scenario == "basic":
            await basic(client, out)
        elif scenario == "gated":
            await gated(client, out, args[3])
        elif scenario == "list":
            await listed(client, out)
        else:
            raise SystemExit(f"unknown scenario {scenario!r}")
    print(json.dumps({"done": out}), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
