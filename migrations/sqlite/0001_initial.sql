-- Tether's SQLite schema, version 1.
--
-- serverSeq is allocated from host.last_seq inside the writing transaction, so
-- it is never reused even if rows were ever removed, and it equals commit order
-- (SQLite has one writer).

CREATE TABLE host (
    id       INTEGER PRIMARY KEY CHECK (id = 1),
    epoch    TEXT    NOT NULL,
    last_seq INTEGER NOT NULL
);

-- The transcript log: one row per accepted envelope.
CREATE TABLE log (
    seq        INTEGER PRIMARY KEY,
    channel    TEXT    NOT NULL,
    session_id TEXT,
    action     TEXT    NOT NULL,
    client_id  TEXT,
    client_seq INTEGER,
    at_ms      INTEGER NOT NULL,
    CHECK ((client_id IS NULL) = (client_seq IS NULL))
);
-- NULLs are distinct, so host-originated rows never collide.
CREATE UNIQUE INDEX log_origin ON log (client_id, client_seq);
CREATE INDEX log_session ON log (session_id, seq) WHERE session_id IS NOT NULL;
CREATE INDEX log_channel ON log (channel, seq);

-- Refused dispatches, so a retry with the same origin gets the same answer.
CREATE TABLE rejections (
    client_id  TEXT    NOT NULL,
    client_seq INTEGER NOT NULL,
    channel    TEXT    NOT NULL,
    action     TEXT    NOT NULL,
    reason     TEXT    NOT NULL,
    at_ms      INTEGER NOT NULL,
    PRIMARY KEY (client_id, client_seq)
);

-- The session read model, written in the same transaction as the log rows it
-- summarises. last_seq is unique per session (each seq belongs to one
-- envelope), so it is both the update order and a gap-free page cursor.
CREATE TABLE sessions (
    id         TEXT    PRIMARY KEY,
    project    TEXT    NOT NULL,
    provider   TEXT    NOT NULL,
    title      TEXT,
    state      TEXT    NOT NULL,
    turns      INTEGER NOT NULL,
    resumable  INTEGER NOT NULL,
    last_seq   INTEGER NOT NULL,
    created_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL,
    projection TEXT    NOT NULL
);
CREATE INDEX sessions_recent ON sessions (last_seq DESC);
CREATE INDEX sessions_project_recent ON sessions (project, last_seq DESC);
CREATE INDEX sessions_state_recent ON sessions (state, last_seq DESC);

-- Periodic channel state snapshots: state at a seq.
CREATE TABLE snapshots (
    channel TEXT    NOT NULL,
    seq     INTEGER NOT NULL,
    state   TEXT    NOT NULL,
    at_ms   INTEGER NOT NULL,
    PRIMARY KEY (channel, seq)
);

-- Working contexts per (project, session).
CREATE TABLE working_contexts (
    project  TEXT    NOT NULL,
    session  TEXT    NOT NULL,
    body     TEXT    NOT NULL,
    saved_ms INTEGER NOT NULL,
    PRIMARY KEY (project, session)
);
CREATE INDEX working_contexts_recent ON working_contexts (project, saved_ms DESC, session);
