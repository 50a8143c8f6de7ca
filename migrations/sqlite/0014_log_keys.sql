-- The log's two indexes hold integers instead of text. Every envelope adds
-- an entry to log_channel (channel URI, seq) and to log_origin (client id,
-- origin scope, client seq); with text keys each insert compared URIs and
-- client ids byte by byte at every level of the B-tree it descended, and
-- the entries (~60 and ~80 bytes) filled and split pages several times as
-- often. Each channel and each client within its scope is now named once,
-- in `channels` and `origins`, and the indexes hold their numbers
-- (store::sqlite::keys; BENCHMARKS.md). The log keeps its text columns:
-- what a row says is unchanged, and `tether migrate` copies those.
--
-- SQLite hosts never run side by side (README, "Backups and upgrades":
-- stop, back up, start the new binary), so the new columns are filled by
-- the writer that inserts a row, and by this migration for rows before it.
CREATE TABLE channels (
    id  INTEGER PRIMARY KEY,
    uri TEXT    NOT NULL UNIQUE
);
CREATE TABLE origins (
    id        INTEGER PRIMARY KEY,
    client_id TEXT    NOT NULL,
    scope     TEXT    NOT NULL,
    UNIQUE (client_id, scope)
);
INSERT INTO channels (uri) SELECT DISTINCT channel FROM log;
INSERT INTO origins (client_id, scope)
    SELECT DISTINCT client_id, origin_scope FROM log WHERE client_id IS NOT NULL;
ALTER TABLE log ADD COLUMN channel_id INTEGER;
ALTER TABLE log ADD COLUMN origin_id INTEGER;
UPDATE log SET
    channel_id = (SELECT id FROM channels WHERE uri = log.channel),
    origin_id = (SELECT id FROM origins
                 WHERE client_id = log.client_id AND scope = log.origin_scope);
DROP INDEX log_channel;
DROP INDEX log_origin;
CREATE INDEX log_channel_id ON log (channel_id); -- each entry ends with the rowid, seq
CREATE UNIQUE INDEX log_origin_id ON log (origin_id, client_seq);
