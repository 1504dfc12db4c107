-- The floor under any Postgres lifecycle with graph-relay's promises, for
-- pgbench: one transaction of this script is one step of ROWS lifecycles
-- in flight together, each step in a statement of its own, as the store's
-- batches are. Three of the four commit and wait for the WAL flush, as a
-- run (the command), a start and a result must; the read is the sync's.
-- The rows are as small as a command can be (no key, no session check, no
-- JSON), so a real store can only be slower.
--
--   pgbench -n -M prepared -c 1 -T 6 -D rows=16 -f floor.sql URL
--
-- Lifecycles per second are pgbench's tps times ROWS. The table is
-- graph_relay_floor.commands, made by floor-table.sql.
WITH queued AS (
    INSERT INTO graph_relay_floor.commands (device, status, revision, record)
        SELECT 'desk-' || g, 'queued', 1, repeat('q', 300) FROM generate_series(1, :rows::int4) AS g
        RETURNING id
) SELECT min(id) AS base FROM queued \gset
SELECT id, revision, record FROM graph_relay_floor.commands
    WHERE id BETWEEN :base::int8 AND :base::int8 + :rows::int4 - 1;
UPDATE graph_relay_floor.commands SET status = 'running', revision = 2, record = repeat('r', 300)
    WHERE id BETWEEN :base::int8 AND :base::int8 + :rows::int4 - 1 AND revision = 1;
UPDATE graph_relay_floor.commands
    SET status = 'completed', revision = 3, finished_at = 1, record = repeat('c', 400)
    WHERE id BETWEEN :base::int8 AND :base::int8 + :rows::int4 - 1 AND revision = 2;
