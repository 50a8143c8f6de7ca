-- A session's row is rewritten by every commit that touches it (its
-- last_seq, update time and projection). While an index holds last_seq or
-- updated_ms, no such rewrite is a HOT update: each one wrote a new entry
-- into all five of the table's indexes, and the versions piled up in them
-- (about half of Postgres's own CPU per action with one dispatch in flight
-- a session; BENCHMARKS.md). The indexes now hold coarse buckets of those
-- values, which change once in 4,096 seqs and once an hour: a rewrite that
-- keeps its buckets is HOT and touches no index. Queries order by the
-- bucket, then by the exact value within it (store::rows).
ALTER TABLE sessions
    ADD COLUMN recency BIGINT GENERATED ALWAYS AS (last_seq / 4096) STORED,
    ADD COLUMN idle_hour BIGINT GENERATED ALWAYS AS (updated_ms / 3600000) STORED;
-- Room on each page for the next version of its rows (HOT keeps a new
-- version on its old one's page).
ALTER TABLE sessions SET (fillfactor = 80);
CREATE INDEX sessions_recency ON sessions (recency DESC);
CREATE INDEX sessions_project_recency ON sessions (project, recency DESC);
CREATE INDEX sessions_state_recency ON sessions (state, recency DESC);
CREATE INDEX sessions_settled_hour ON sessions (project, idle_hour) WHERE state <> 'live';
DROP INDEX sessions_recent;
DROP INDEX sessions_project_recent;
DROP INDEX sessions_state_recent;
DROP INDEX sessions_settled;
