"""Drives graph-relay with the official Python MCP client (mcp==2.3.0).

Usage: client_flow.py stdio|http MODE BINARY_OR_URL CONFIG DB GOLDEN [TOKEN OTHER_TOKEN]
  MODE: legacy | 2026-07-28
stdio: BINARY is the graph-relay binary; agents dev-agent and other-agent are in CONFIG.
http:  URL is the /mcp endpoint; TOKEN/OTHER_TOKEN are bearer tokens of the two agents.
Exits non-zero with a message on the first failed expectation.
"""
import asyncio, json, sys, uuid

import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

GS = "gs_0123456789abcdef0123456789abcdef"


def target(kind, where, config, db, agent, token):
    if kind == "stdio":
        return StdioServerParameters(command=where, args=["stdio", "--config", config, "--db", db, "--agent", agent])
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(30, read=60))
    return streamable_http_client(where, http_client=http)


def check(cond, what):
    if not cond:
        print(f"FAILED: {what}", file=sys.stderr)
        sys.exit(1)


async def main():
    kind, mode, where, config, db, golden = sys.argv[1:7]
    token, other_token = (sys.argv[7], sys.argv[8]) if kind == "http" else (None, None)
    expected = json.load(open(golden))
    async with Client(target(kind, where, config, db, "dev-agent", token), mode=mode, cache=None) as c:
        print("negotiated", c.protocol_version)
        listed = await c.list_tools()
        got = [t.model_dump(by_alias=True, exclude_none=True, mode="json") for t in listed.tools]
        # Compare the fields the golden file pins (the client model may add defaults).
        for g, e in zip(got, expected):
            for key in ("name", "description", "inputSchema", "annotations"):
                check(g.get(key) == e.get(key), f"tools/list {e['name']}.{key}: {g.get(key)} != {e.get(key)}")
        check([t.name for t in listed.tools] == [e["name"] for e in expected], "tool names")

        key = f"py-{mode}-{kind}-{uuid.uuid4().hex[:8]}"
        run = await c.call_tool("run_graph_session", {"graph_session_id": GS, "idempotency_key": key})
        check(not run.is_error, f"run_graph_session: {run.content}")
        ticket = run.structured_content
        check(ticket["status"] == "queued", f"ticket {ticket}")
        check("get_graph_run" in run.content[0].text and "ticket" in run.content[0].text.lower(), "ticket text")
        cid = ticket["command_id"]
        got = await c.call_tool("get_graph_run", {"command_id": cid})
        check(not got.is_error and got.structured_content["status"] == "queued", f"get {got}")
        cancelled = await c.call_tool("cancel_graph_run", {"command_id": cid})
        check(cancelled.structured_content["status"] == "cancelled", f"cancel {cancelled}")
        bad = await c.call_tool("get_graph_run", {"command_id": "not-a-uuid"})
        check(bad.is_error and "command_id" in bad.content[0].text, f"bad id {bad}")

    async with Client(target(kind, where, config, db, "other-agent", other_token), mode=mode, cache=None) as o:
        hidden = await o.call_tool("get_graph_run", {"command_id": cid})
        check(hidden.is_error and hidden.content[0].text == "Graph run not found or access removed", f"hidden {hidden}")
    print("OK", kind, mode)


asyncio.run(main())
