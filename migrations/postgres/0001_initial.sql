-- Tether's Postgres schema, version 1.
--
-- serverSeq is allocated from host.last_seq under the host row's lock, taken
-- inside the committing transaction and held until commit. Several hosts can
-- share this database: the lock serialises their appends, so seq order equals
-- commit order and a tailing host never sees a later seq before an earlier one.

CREATE TABLE host (
    id       SMALLINT PRIMARY KEY CHECK (id = 1),
    epoch    TEXT     NOT NULL,
    last_seq BIGINT   NOT NULL
);

CREATE TABLE log (
    seq        BIGINT PRIMARY KEY,
    channel    TEXT   NOT NULL,
    session_id TEXT,
    -- TEXT, not JSONB: the exact bytes are re-sent on a retried dispatch.
    action     TEXT   NOT NULL,
    client_id  TEXT,
    client_seq BIGINT,
    at_ms      BIGINT NOT NULL,
    CHECK ((client_id IS NULL) = (client_seq IS NULL))
);
CREATE UNIQUE INDEX log_origin ON log (client_id, client_seq);
CREATE INDEX log_session ON log (session_id, seq) WHERE session_id IS NOT NULL;
CREATE INDEX log_channel ON log (channel, seq);

CREATE TABLE rejections (
    client_id  TEXT   NOT NULL,
    client_seq BIGINT NOT NULL,
    channel    TEXT   NOT NULL,
    action     TEXT   NOT NULL,
    reason     TEXT   NOT NULL,
    at_ms      BIGINT NOT NULL,
    PRIMARY KEY (client_id, client_seq)
);

CREATE TABLE sessions (
    id         TEXT    PRIMARY KEY,
    project    TEXT    NOT NULL,
    provider   TEXT    NOT NULL,
    title      TEXT,
    state      TEXT    NOT NULL,
    turns      BIGINT  NOT NULL,
    resumable  BOOLEAN NOT NULL,
    last_seq   BIGINT  NOT NULL,
    created_ms BIGINT  NOT NULL,
    updated_ms BIGINT  NOT NULL,
    projection TEXT    NOT NULL
);
CREATE INDEX sessions_recent ON sessions (last_seq DESC);
CREATE INDEX sessions_project_recent ON sessions (project, last_seq DESC);
CREATE INDEX sessions_state_recent ON sessions (state, last_seq DESC);

CREATE TABLE snapshots (
    channel TEXT   NOT NULL,
    seq     BIGINT NOT NULL,
    state   TEXT   NOT NULL,
    at_ms   BIGINT NOT NULL,
    PRIMARY KEY (channel, seq)
);

CREATE TABLE working_contexts (
    project  TEXT   NOT NULL,
    session  TEXT   NOT NULL,
    body     TEXT   NOT NULL,
    saved_ms BIGINT NOT NULL,
    PRIMARY KEY (project, session)
);
CREATE INDEX working_contexts_recent ON working_contexts (project, saved_ms DESC, session);
