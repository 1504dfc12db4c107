// A real authorization server for graph-relay's OAuth tests: oidc-provider
// (a certified OpenID Provider) on loopback, with resource indicators
// (RFC 8707) so that access tokens are JWTs (RFC 9068) for graph-relay's
// /mcp URL, client credentials, dynamic client registration, the
// development login/consent pages and token introspection (RFC 7662).
//
// Usage: node provider.mjs            (settings from the environment)
//   OIDC_MODULES      the node_modules folder holding oidc-provider (required)
//   PORT              port on 127.0.0.1 (default 0: any free port)
//   TOKEN_FORMAT      jwt (default) or opaque
// It prints one line `listening <issuer>` when it serves.
//
// Clients it knows (besides those registered dynamically):
//   cc-agent / cc-secret    client credentials, osfoundry:read osfoundry:run
//   cc-reader / cc-secret   client credentials, osfoundry:read only
//   graph-relay / rs-secret the resource server, for introspection
//
// Test-only endpoints (not part of oidc-provider):
//   POST /test/rotate           new signing key; the old one is no longer published
//   POST /test/sign             {claims, previous?} → {token} signed like an access token
//                               (with the key before the last rotation when `previous`)
//   POST /test/sign-hs256       {claims} → {token}: HS256 keyed with the public key (PEM)
import http from 'node:http';
import { createPublicKey, createSecretKey } from 'node:crypto';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const modules = process.env.OIDC_MODULES;
if (!modules) {
  console.error('OIDC_MODULES must name the node_modules folder that holds oidc-provider');
  process.exit(2);
}
const load = (rel) => import(pathToFileURL(path.join(modules, rel)).href);
const { default: Provider, errors } = await load('oidc-provider/lib/index.js');
const jose = await load('jose/dist/webapi/index.js');

const format = process.env.TOKEN_FORMAT === 'opaque' ? 'opaque' : 'jwt';
const SCOPES = 'osfoundry:read osfoundry:run';

let generation = 0;
async function newKey() {
  generation += 1;
  const { privateKey } = await jose.generateKeyPair('RS256', { extractable: true });
  const jwk = await jose.exportJWK(privateKey);
  return { ...jwk, kid: `key-${generation}-${Date.now()}`, alg: 'RS256', use: 'sig' };
}

function configuration(key) {
  return {
    clients: [
      { client_id: 'cc-agent', client_secret: 'cc-secret', grant_types: ['client_credentials'], redirect_uris: [], response_types: [] },
      { client_id: 'cc-reader', client_secret: 'cc-secret', grant_types: ['client_credentials'], redirect_uris: [], response_types: [] },
      { client_id: 'graph-relay', client_secret: 'rs-secret', grant_types: [], redirect_uris: [], response_types: [] },
    ],
    jwks: { keys: [key] },
    cookies: { keys: ['graph-relay-tests-only'] },
    // Registered clients may name the resource's scopes in their metadata.
    scopes: ['openid', 'offline_access', 'osfoundry:read', 'osfoundry:run'],
    features: {
      clientCredentials: { enabled: true },
      introspection: { enabled: true },
      registration: { enabled: true },
      devInteractions: { enabled: true },
      resourceIndicators: {
        enabled: true,
        // Our audience is whatever http(s) resource the client names
        // (graph-relay's /mcp URL); a token for another URL is for another resource.
        defaultResource: async (_ctx, _client, oneOf) => oneOf,
        useGrantedResource: async () => true,
        getResourceServerInfo: async (_ctx, indicator, client) => {
          if (!/^https?:\/\//.test(indicator)) throw new errors.InvalidTarget();
          // cc-reader may only read: its tokens lack the run scope.
          const scope = client.clientId === 'cc-reader' ? 'osfoundry:read' : SCOPES;
          return { scope, audience: indicator, accessTokenTTL: 3600, accessTokenFormat: format, jwt: { sign: { alg: 'RS256' } } };
        },
      },
    },
  };
}

let issuer;
let keys = [];
let current;

async function build() {
  const key = await newKey();
  keys = [key, ...keys].slice(0, 2);
  const provider = new Provider(issuer, configuration(key));
  provider.proxy = false;
  current = { provider, handler: provider.callback() };
}

async function body(req) {
  let text = '';
  for await (const chunk of req) text += chunk;
  return text ? JSON.parse(text) : {};
}

function reply(res, status, value) {
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(JSON.stringify(value));
}

async function test(req, res) {
  const url = new URL(req.url, issuer);
  if (req.method === 'POST' && url.pathname === '/test/rotate') {
    await build();
    return reply(res, 200, { kid: keys[0].kid });
  }
  if (req.method === 'POST' && url.pathname === '/test/sign') {
    const { claims, previous } = await body(req);
    const jwk = previous ? keys[1] : keys[0];
    if (!jwk) return reply(res, 409, { error: 'no previous key' });
    const key = await jose.importJWK(jwk, 'RS256');
    const token = await new jose.SignJWT(claims)
      .setProtectedHeader({ alg: 'RS256', typ: 'at+jwt', kid: jwk.kid })
      .sign(key);
    return reply(res, 200, { token });
  }
  if (req.method === 'POST' && url.pathname === '/test/sign-hs256') {
    const { claims } = await body(req);
    const { d, p, q, dp, dq, qi, ...pub } = keys[0];
    const pem = createPublicKey({ key: pub, format: 'jwk' }).export({ type: 'spki', format: 'pem' });
    const token = await new jose.SignJWT(claims)
      .setProtectedHeader({ alg: 'HS256', typ: 'at+jwt', kid: keys[0].kid })
      .sign(createSecretKey(Buffer.from(pem)));
    return reply(res, 200, { token });
  }
  return reply(res, 404, { error: 'not found' });
}

const server = http.createServer((req, res) => {
  if (req.url.startsWith('/test/') && current) {
    test(req, res).catch((e) => reply(res, 500, { error: String(e) }));
    return;
  }
  // Between listen() and the first key, answer like a server still
  // starting (the relay server may retry before the provider is built).
  if (!current) return reply(res, 503, { error: 'starting' });
  current.handler(req, res);
});
server.listen(Number(process.env.PORT || 0), '127.0.0.1', async () => {
  issuer = `http://127.0.0.1:${server.address().port}`;
  await build();
  console.log(`listening ${issuer}`);
});
