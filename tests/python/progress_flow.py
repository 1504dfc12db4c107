"""Progress notifications to the official Python MCP client (mcp==2.3.0).

Usage: progress_flow.py MODE MCP_URL TOKEN
  MODE: legacy | 2026-07-28

Queues a run and prints `queued <command id>`, then calls get_graph_run with
wait_seconds and a progress callback. Each notification is printed at once
as `progress <progress> <total> <message>` (the test reports the next step
when it reads one), and the waiting call's result as `result <status>`.
Exits non-zero on the first failed expectation.
"""
import asyncio
import sys
import uuid

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

GS = "gs_0123456789abcdef0123456789abcdef"


def say(*words):
    print(*words, flush=True)


def check(cond, what):
    if not cond:
        print(f"FAILED: {what}", file=sys.stderr, flush=True)
        sys.exit(1)


async def main():
    mode, url, token = sys.argv[1:4]
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(30, read=60))
    seen = []

    async def on_progress(progress, total, message):
        seen.append((progress, total, message))
        say("progress", progress, total, message)

    async with Client(streamable_http_client(url, http_client=http), mode=mode, cache=None) as c:
        key = f"progress-{mode}-{uuid.uuid4().hex[:8]}"
        run = await c.call_tool("run_graph_session", {"graph_session_id": GS, "idempotency_key": key})
        check(not run.is_error, f"run_graph_session: {run.content}")
        cid = run.structured_content["command_id"]
        say("queued", cid)
        got = await c.call_tool(
            "get_graph_run", {"command_id": cid, "wait_seconds": 20}, progress_callback=on_progress
        )
        check(not got.is_error, f"get_graph_run: {got.content}")
        say("result", got.structured_content["status"])
        values = [p for p, _, _ in seen]
        check(values == sorted(values) and len(set(values)) == len(values), f"progress grows: {values}")
        steps = [m for _, _, m in seen if m and "step" in m]
        check(len(steps) == 5, f"five steps: {seen}")
        check(all(f"step {i} of 5" in steps[i - 1] for i in range(1, 6)), f"steps in order: {steps}")
        check(got.structured_content["progress"]["percent"] == 100, f"last progress kept: {got.structured_content}")


asyncio.run(main())
