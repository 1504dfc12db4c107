"""Drives the API-key server example (transport-http/examples/api_key_server.rs)
with the official Python MCP client (mcp==2.3.0), authenticating with X-Api-Key.

Usage: api_key_flow.py run MODE URL KEY            -> prints "COMMAND <id>"
       api_key_flow.py finished MODE URL KEY ID    -> checks the run completed
  MODE: legacy | 2026-07-28; URL is the /mcp endpoint.
Exits non-zero with a message on the first failed expectation.
"""
import asyncio, json, sys, uuid

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

GS = "gs_0123456789abcdef0123456789abcdef"
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}


def check(cond, what):
    if not cond:
        print(f"FAILED: {what}", file=sys.stderr)
        sys.exit(1)


def client(url, key, mode):
    http = httpx2.AsyncClient(headers={"X-Api-Key": key}, timeout=httpx2.Timeout(30, read=60))
    return Client(streamable_http_client(url, http_client=http), mode=mode, cache=None)


async def refusals(url):
    """Without the key, or with a wrong one: this server's own 401 challenge."""
    async with httpx2.AsyncClient(timeout=30) as raw:
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        for extra, error in (({}, "missing_api_key"), ({"X-Api-Key": "wrong"}, "invalid_api_key"),
                             ({"Authorization": "Bearer gra_x"}, "missing_api_key")):
            r = await raw.post(url, headers={**headers, **extra}, content=json.dumps(INIT))
            check(r.status_code == 401, f"{extra}: status {r.status_code}")
            challenge = r.headers.get("www-authenticate", "")
            check(challenge.startswith("ApiKey ") and 'header="X-Api-Key"' in challenge, f"challenge {challenge!r}")
            check(r.json()["error"] == error, f"{extra}: body {r.text}")


async def main():
    phase, mode, url, key = sys.argv[1:5]
    if phase == "run":
        await refusals(url)
        async with client(url, key, mode) as c:
            names = [t.name for t in (await c.list_tools()).tools]
            check({"run_graph_session", "get_graph_run", "cancel_graph_run"} <= set(names), f"tools {names}")
            run = await c.call_tool("run_graph_session", {
                "graph_session_id": GS, "idempotency_key": f"api-key-{uuid.uuid4().hex[:8]}"})
            check(not run.is_error, f"run_graph_session: {run.content}")
            check(run.structured_content["status"] == "queued", f"ticket {run.structured_content}")
            print("COMMAND", run.structured_content["command_id"])
    elif phase == "finished":
        async with client(url, key, mode) as c:
            got = await c.call_tool("get_graph_run", {"command_id": sys.argv[5]})
            check(not got.is_error, f"get_graph_run: {got.content}")
            check(got.structured_content["status"] == "completed", f"status {got.structured_content}")
            check(json.dumps(got.structured_content).find('"answer": 42') >= 0, f"result {got.structured_content}")
            print("OK", mode)
    else:
        check(False, f"unknown phase {phase}")


asyncio.run(main())
