//! The closing text of `serve --help` and `worker --help`: every feature
//! of the command and its files, by the words a reader searches for, and
//! where each is documented. `cli/tests/help.rs` holds the table of what
//! must stay named here.

/// After the options of `graph-relay serve --help`.
pub const SERVE: &str = "\
Configuration file (--config, default graph-relay.toml; created with a
development agent and device when absent; read at start):
  [server]   the HTTP edge and the queue's timing:
             public_url, authorization_servers (announced in the RFC 9728
             resource metadata at /.well-known/oauth-protected-resource/mcp),
             allowed_hosts, allowed_origins, allowed_ports (Host/Origin
             checks against DNS rebinding), max_body_bytes,
             request_timeout_secs, max_connections, header_read_timeout_secs,
             idle_timeout_secs, max_sessions, max_sessions_per_agent,
             session_idle_timeout_secs, max_listen_streams_per_agent,
             max_listen_lifetime_secs, lease_seconds, lease_interval_controls,
             metrics_listen, operator_token_sha256
  [oauth]    accept OAuth 2.1 access tokens of an external authorization
             server besides the static tokens: issuer, jwks_uri, audience,
             algorithms, clock_skew_seconds, token_types, agent_claim,
             owner, owner_claim, projects, projects_claim,
             jwks_cache_seconds, jwks_refetch_min_seconds,
             http_timeout_seconds, [[oauth.subject]] (per-subject owner and
             projects), [oauth.introspection] (opaque tokens, RFC 7662:
             client_id, client_secret, endpoint, active_cache_seconds,
             inactive_cache_seconds)
  [[agent]]  agent tokens (SHA-256 hashes only), each with owner, scopes
             (osfoundry:read, osfoundry:run) and projects
  [[device]] device tokens of desktops (workers)
  Tokens are created, listed and revoked with `graph-relay token`.

Features:
  MCP        POST /mcp (Streamable HTTP): run_graph_session,
             list_graph_sessions, get_graph_run, cancel_graph_run, the tasks
             extension and subscriptions/listen; stdio: `graph-relay stdio`
  long-poll  desktops' syncs and control requests are held until work or a
             cancel arrives; agents may wait too with --max-wait-seconds
             (wait_seconds on get_graph_run)
  threads    --connection-threads N: threads that each keep their own
             connections (default one per processor; 0 serves them on the
             shared workers, which costs more with many held long-polls)
  leases     a running run whose desktop goes silent ends failed after
             --lease-seconds (long-poll) or --lease-controls (interval)
  progress   what a Graph reports while it runs reaches agents through
             get_graph_run, task status and progress notifications
  approval   runs needing the owner's approval wait on the desktop
             (graphs.toml approval keys, `worker --console`); the server
             sees only the progress \"Waiting for the owner's approval on
             the desktop\"
  metrics    --metrics ADDR (or metrics_listen): Prometheus GET /metrics on
             a listener of its own
  status     GET /admin/status on the metrics listener with the operator
             token (`graph-relay token operator`), read by
             `graph-relay status --server URL --token FILE`; or
             `graph-relay status --db FILE` on the SQLite database
  stores     --db (SQLite, default), --memory, --postgres (several servers
             on one queue)
  log        GRAPH_RELAY_LOG sets the log filter (default info)

Documentation: docs/operating.md (configuration file, [server] and [oauth]
settings, metrics, status, leases, Postgres), docs/connecting-clients.md
(agents, OAuth and authorization servers), docs/desktop-console.md (approval on the
desktop), and README.md.";

/// After the options of `graph-relay worker --help`.
pub const WORKER: &str = "\
The graphs file (--graphs, graphs.toml; re-read when it changes, un-sharing
takes effect at once):
  projects = [...]           projects enabled on this desktop
  [[graph]]                  one shared Graph: id (gs_ + 32 hex), name,
                             description, slug, version, status, projects,
                             command (argv, no shell), working_dir,
                             timeout_seconds, env
  approval = \"always\"        every run waits for the owner's approval;
  approval_timeout_seconds   how long it waits (then the run fails);
  approval_command = [...]   a hook asked for it (exit 0 approves).
  Consent is re-checked just before each run.

Features:
  modes      --mode long-poll (held requests, default) or interval (a pass
             every 20 s, a control poll every 3 s); each control request
             renews the run's lease on the server
  approval   answered by approval_command, by the console, or by
             `graph-relay approve`/`graph-relay deny --console URL ID`; with
             neither hook nor console such runs time out (a warning at start)
  console    --console 127.0.0.1:PORT: a local page to approve or decline
             waiting runs, watch and cancel the running one, and see the
             last 50 finished runs
  progress   a Graph reports progress by writing JSON lines
             ({\"message\": \"...\", \"percent\": 40}) to file descriptor 3
             (GRAPH_RELAY_PROGRESS_FD); agents see the latest report;
             --progress-every prints a status line while a run runs
  runs       arguments as JSON on stdin, result on stdout, usage line
             {\"graph_relay\": {...}}, GRAPH_RELAY_COMMAND_ID,
             GRAPH_RELAY_EXECUTION_ID, GRAPH_RELAY_CHANNEL; cancel and
             timeout stop the process group (SIGTERM, SIGKILL after
             --grace-seconds)
  outbox     --outbox FILE (SQLite): completions are kept until the server
             acknowledges them; a restarted worker ends the Graph processes
             a crashed predecessor left running
  metrics    --metrics 127.0.0.1:PORT: the desktop's Prometheus GET /metrics
  output     --quiet, --verbose; GRAPH_RELAY_LOG sets the log filter

Documentation: docs/writing-a-graph.md (graphs.toml, the script contract,
progress, approval), docs/desktop-console.md (the console, approve and deny),
docs/operating.md (running a worker, metrics), and README.md.";
