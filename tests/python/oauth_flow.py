"""Connects the official Python MCP client (mcp==2.3.0) to graph-relay through
a real authorization server, starting from graph-relay's URL alone: the SDK
finds the resource metadata (RFC 9728), the authorization server's metadata
(RFC 8414 / OpenID discovery), gets a token for graph-relay's resource
(RFC 8707), then lists tools, runs, reads and cancels.

Usage:
  oauth_flow.py client-credentials MODE MCP_URL ISSUER CLIENT_ID CLIENT_SECRET
  oauth_flow.py authorization-code MODE MCP_URL ISSUER LOGIN
MODE: legacy | 2026-07-28.

authorization-code registers a client dynamically (RFC 7591), sends the user
to the authorization endpoint with PKCE, and plays the user headlessly over
HTTP: it signs in as LOGIN on oidc-provider's login page, consents, and hands
the code from the redirect back to the SDK.
Prints `OK <flow> <mode> <agent>` and exits 0, or names the failed expectation.
"""
import asyncio
import re
import sys
import uuid
from urllib.parse import parse_qs, urljoin, urlparse

import httpx2
from mcp import Client
from mcp.client.auth import AuthorizationCodeResult, OAuthClientProvider, TokenStorage
from mcp.client.auth.extensions.client_credentials import ClientCredentialsOAuthProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import OAuthClientMetadata

GS = "gs_0123456789abcdef0123456789abcdef"
SCOPES = "osfoundry:read osfoundry:run"
REDIRECT = "http://127.0.0.1:9/callback"


def check(cond, what):
    if not cond:
        print(f"FAILED: {what}", file=sys.stderr)
        sys.exit(1)


class MemoryStorage(TokenStorage):
    def __init__(self):
        self.tokens = None
        self.client = None

    async def get_tokens(self):
        return self.tokens

    async def set_tokens(self, tokens):
        self.tokens = tokens

    async def get_client_info(self):
        return self.client

    async def set_client_info(self, client_info):
        self.client = client_info


class HeadlessUser:
    """Plays the user at oidc-provider's development login and consent pages."""

    def __init__(self, login):
        self.login = login
        self.result = None

    async def redirect(self, authorization_url):
        async with httpx2.AsyncClient(follow_redirects=False, timeout=30) as browser:
            url = authorization_url
            for _ in range(20):
                response = await browser.get(url)
                if response.status_code in (302, 303):
                    url = urljoin(url, response.headers["location"])
                    if url.startswith(REDIRECT):
                        query = parse_qs(urlparse(url).query)
                        check("code" in query, f"authorization failed: {query}")
                        self.result = AuthorizationCodeResult(
                            code=query["code"][0],
                            state=query.get("state", [None])[0],
                            iss=query.get("iss", [None])[0],
                        )
                        return
                    continue
                check(response.status_code == 200, f"{url}: HTTP {response.status_code} {response.text[:300]}")
                form = re.search(r'<form[^>]*action="([^"]+)"', response.text)
                check(form is not None, f"no form at {url}: {response.text[:300]}")
                action = urljoin(url, form.group(1))
                if 'name="login"' in response.text:
                    data = {"prompt": "login", "login": self.login, "password": "any"}
                else:
                    data = {"prompt": "consent"}
                posted = await browser.post(action, data=data)
                check(posted.status_code in (302, 303), f"submit {action}: HTTP {posted.status_code} {posted.text[:300]}")
                url = urljoin(action, posted.headers["location"])
                if url.startswith(REDIRECT):
                    query = parse_qs(urlparse(url).query)
                    self.result = AuthorizationCodeResult(
                        code=query["code"][0], state=query.get("state", [None])[0], iss=query.get("iss", [None])[0]
                    )
                    return
            check(False, "the authorization flow did not reach the redirect URI")

    async def callback(self):
        check(self.result is not None, "no authorization code")
        return self.result


async def exercise(client, mode, flow):
    listed = await client.list_tools()
    names = [t.name for t in listed.tools]
    check("run_graph_session" in names and "get_graph_run" in names, f"tools/list: {names}")
    key = f"oauth-{flow}-{mode}-{uuid.uuid4().hex[:8]}"
    run = await client.call_tool("run_graph_session", {"graph_session_id": GS, "idempotency_key": key})
    check(not run.is_error, f"run_graph_session: {run.content}")
    cid = run.structured_content["command_id"]
    got = await client.call_tool("get_graph_run", {"command_id": cid})
    check(not got.is_error and got.structured_content["status"] == "queued", f"get_graph_run: {got}")
    cancelled = await client.call_tool("cancel_graph_run", {"command_id": cid})
    check(cancelled.structured_content["status"] == "cancelled", f"cancel_graph_run: {cancelled}")
    return cid


async def main():
    flow, mode, url, issuer = sys.argv[1:5]
    storage = MemoryStorage()
    if flow == "client-credentials":
        client_id, secret = sys.argv[5:7]
        auth = ClientCredentialsOAuthProvider(
            server_url=url, storage=storage, client_id=client_id, client_secret=secret, scope=SCOPES, issuer=issuer
        )
    elif flow == "authorization-code":
        user = HeadlessUser(sys.argv[5])
        auth = OAuthClientProvider(
            server_url=url,
            client_metadata=OAuthClientMetadata(
                client_name="graph-relay test connector",
                redirect_uris=[REDIRECT],
                grant_types=["authorization_code", "refresh_token"],
                response_types=["code"],
                scope=SCOPES,
                token_endpoint_auth_method="client_secret_basic",
            ),
            storage=storage,
            redirect_handler=user.redirect,
            callback_handler=user.callback,
        )
    else:
        check(False, f"unknown flow {flow}")
    http = httpx2.AsyncClient(auth=auth, timeout=httpx2.Timeout(30, read=60))
    async with Client(streamable_http_client(url, http_client=http), mode=mode, cache=None) as client:
        cid = await exercise(client, mode, flow)
    check(storage.tokens is not None and storage.tokens.access_token.count(".") == 2, "a JWT access token was obtained")
    if flow == "authorization-code":
        check(storage.client is not None and storage.client.client_id, "the client registered dynamically")
    print("OK", flow, mode, cid)


asyncio.run(main())
