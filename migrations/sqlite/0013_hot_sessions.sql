-- A session's row is rewritten by every commit that touches it (its
-- last_seq, update time and projection). While an index holds last_seq or
-- updated_ms, each rewrite moved the row's entry in all four of the table's
-- indexes: SQLite deletes and inserts an index's entry whenever the
-- statement sets one of its columns, so every commit dirtied four index
-- pages a session, scattered, beside the row's own (BENCHMARKS.md). As on
-- Postgres (its migration 0016), the indexes now hold coarse buckets of
-- those values, which change once in 4,096 seqs and once an hour. They are
-- plain columns the writer sets (a generated column is recomputed, and its
-- index entries rewritten, whenever a column it reads is set): a commit
-- that keeps a row's buckets, state and project updates only columns no
-- index holds (store::sqlite::append). Queries order by the bucket, then by
-- the exact value within it (store::rows).
ALTER TABLE sessions ADD COLUMN recency INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN idle_hour INTEGER NOT NULL DEFAULT 0;
UPDATE sessions SET recency = last_seq / 4096, idle_hour = updated_ms / 3600000;
CREATE INDEX sessions_recency ON sessions (recency DESC);
CREATE INDEX sessions_project_recency ON sessions (project, recency DESC);
CREATE INDEX sessions_state_recency ON sessions (state, recency DESC);
CREATE INDEX sessions_settled_hour ON sessions (project, idle_hour) WHERE state <> 'live';
DROP INDEX sessions_recent;
DROP INDEX sessions_project_recent;
DROP INDEX sessions_state_recent;
DROP INDEX sessions_settled;
