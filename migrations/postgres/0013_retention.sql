-- How long each project keeps settled sessions (DESIGN.md, "Finding,
-- notifying, keeping"): a session settled (dormant, closed or ended) with
-- nothing written for longer than `days` is deleted with everything it
-- owns by the retention task. Projects without a row keep everything.
CREATE TABLE retention (
    project    TEXT    PRIMARY KEY,
    days       BIGINT  NOT NULL CHECK (days > 0),
    updated_ms BIGINT  NOT NULL
);
-- Settled sessions, oldest first: what retention looks at.
CREATE INDEX sessions_settled ON sessions (project, updated_ms) WHERE state <> 'live';
