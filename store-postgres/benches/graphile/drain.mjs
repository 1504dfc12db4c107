// graphile-worker's batched drain of already-queued jobs, in jobs/s.
//
//   node drain.mjs [JOBS] [ROUNDS]     (defaults: 20000 jobs, 3 rounds)
//
// For each concurrency in GRAPHILE_CONCURRENCY (default "16,64", to stand
// beside the lifecycles bench's 16 and 64 in flight) and each round: JOBS
// no-op jobs are added in one transaction, then a worker is started with
// graphile-worker's batching settings (the ones its own perfTest uses: a
// local queue of 500 jobs fetched and locked at once, completions batched
// with completeJobBatchDelay 0) and timed from its start until its last
// job completed. The best round of each concurrency is printed.
//
// The database is GRAPH_RELAY_GRAPHILE_DB (default
// graph_relay_graphile_bench) on the server of GRAPH_RELAY_POSTGRES_URL (or
// postgres://postgres@127.0.0.1:5432/test): it is dropped and created
// afresh, so every run starts from empty tables, and dropped at the end.

import { readFileSync } from "node:fs";
import pg from "pg";
import { Logger, run, runMigrations } from "graphile-worker";

// Quiet: the worker's own logging would cost time in the measured drain.
const logger = new Logger(() => () => {});
const version = JSON.parse(
  readFileSync(new URL("./node_modules/graphile-worker/package.json", import.meta.url), "utf8"),
).version;

const serverUrl =
  process.env.GRAPH_RELAY_POSTGRES_URL ||
  "postgres://postgres@127.0.0.1:5432/test";
const dbName = process.env.GRAPH_RELAY_GRAPHILE_DB || "graph_relay_graphile_bench";
const jobs = Number.parseInt(process.argv[2] || "20000", 10);
const rounds = Number.parseInt(process.argv[3] || "3", 10);
const concurrencies = (process.env.GRAPHILE_CONCURRENCY || "16,64")
  .split(",")
  .map((n) => Number.parseInt(n, 10));

if (!/^[a-z_][a-z0-9_]{0,62}$/.test(dbName)) {
  throw new Error(`GRAPH_RELAY_GRAPHILE_DB must be a plain identifier, not ${dbName}`);
}
if (!(jobs > 0) || !(rounds > 0) || concurrencies.some((c) => !(c > 0))) {
  throw new Error("usage: node drain.mjs [JOBS > 0] [ROUNDS > 0]; GRAPHILE_CONCURRENCY=16,64");
}

/** Runs one statement on the server's own database (not the bench's). */
async function admin(sql) {
  const client = new pg.Client({ connectionString: serverUrl });
  await client.connect();
  try {
    await client.query(sql);
  } finally {
    await client.end();
  }
}

const benchUrl = new URL(serverUrl);
benchUrl.pathname = `/${dbName}`;
const connectionString = benchUrl.toString();

/** Adds `count` no-op jobs in one transaction. */
async function addJobs(count) {
  const client = new pg.Client({ connectionString });
  await client.connect();
  try {
    await client.query(
      `SELECT count(*) FROM graphile_worker.add_jobs(array(
         SELECT ROW('noop', json_build_object('n', n), NULL, NULL, NULL, NULL, NULL, NULL)::graphile_worker.job_spec
         FROM generate_series(1, $1::int) AS n))`,
      [count],
    );
  } finally {
    await client.end();
  }
}

/** Starts a worker and resolves with jobs/s once `count` jobs completed. */
async function drain(count, concurrency) {
  let done = 0;
  let finished;
  const allDone = new Promise((resolve) => {
    finished = resolve;
  });
  const start = performance.now();
  const runner = await run({
    connectionString,
    concurrency,
    noHandleSignals: true,
    pollInterval: 1000,
    taskList: {
      noop: async () => {
        done += 1;
        if (done === count) finished(performance.now());
      },
    },
    preset: {
      worker: {
        concurrentJobs: concurrency,
        maxPoolSize: concurrency + 1,
        localQueue: { size: 500, refetchDelay: { durationMs: 10 } },
        completeJobBatchDelay: 0,
        failJobBatchDelay: 0,
      },
    },
    logger,
  });
  const end = await allDone;
  await runner.stop();
  // Completions are written in batches after the task returned: wait until
  // the table is empty so the next round starts from nothing.
  const client = new pg.Client({ connectionString });
  await client.connect();
  try {
    for (;;) {
      const { rows } = await client.query("SELECT count(*)::int AS n FROM graphile_worker._private_jobs");
      if (rows[0].n === 0) break;
      await new Promise((r) => setTimeout(r, 50));
    }
  } finally {
    await client.end();
  }
  return count / ((end - start) / 1000);
}

await admin(`DROP DATABASE IF EXISTS "${dbName}" WITH (FORCE)`);
await admin(`CREATE DATABASE "${dbName}"`);
try {
  await runMigrations({ connectionString, logger });
  const best = [];
  for (const concurrency of concurrencies) {
    let top = 0;
    for (let round = 0; round < rounds; round += 1) {
      await addJobs(jobs);
      top = Math.max(top, await drain(jobs, concurrency));
    }
    best.push([concurrency, top]);
  }
  console.log(`\ngraphile-worker ${version}: drain of ${jobs} queued jobs, best of ${rounds}`);
  console.log(`${"concurrency".padEnd(12)} ${"jobs/s".padStart(10)}`);
  for (const [concurrency, rate] of best) {
    console.log(`${String(concurrency).padEnd(12)} ${rate.toFixed(0).padStart(10)}`);
  }
} finally {
  await admin(`DROP DATABASE IF EXISTS "${dbName}" WITH (FORCE)`);
}
