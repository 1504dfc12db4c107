-- The table of floor.sql, afresh, in a schema of its own: an identity key
-- (the store's UUIDv7 ids are time-ordered too), the fill factor of the
-- store's commands and an index of the open commands, as the store has.
SET client_min_messages = warning;
DROP SCHEMA IF EXISTS graph_relay_floor CASCADE;
CREATE SCHEMA graph_relay_floor;
CREATE TABLE graph_relay_floor.commands (
    id          INT8 GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    device      TEXT NOT NULL,
    status      TEXT NOT NULL,
    revision    INT8 NOT NULL,
    record      TEXT NOT NULL,
    finished_at INT8
) WITH (fillfactor = 50);
CREATE INDEX commands_open ON graph_relay_floor.commands (device, id) WHERE finished_at IS NULL;
