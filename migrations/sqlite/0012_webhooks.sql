-- Webhooks and their outbox (DESIGN.md, "Finding, notifying, keeping").
--
-- webhooks: a project's receivers, each with its own signing secret and
-- the event kinds it wants (a JSON array; empty: all).
CREATE TABLE webhooks (
    id         TEXT    PRIMARY KEY,
    project    TEXT    NOT NULL,
    url        TEXT    NOT NULL,
    secret     TEXT    NOT NULL,
    events     TEXT    NOT NULL,
    created_ms INTEGER NOT NULL,
    created_by TEXT    NOT NULL
);
CREATE INDEX webhooks_project ON webhooks (project);

-- outbox: each event, written in the transaction that appends the envelope
-- that raised it, and only when its project has a webhook for it. Its id
-- (the envelope's seq and the kind) is the receivers' deduplication key.
CREATE TABLE outbox (
    event_id   TEXT    PRIMARY KEY,
    kind       TEXT    NOT NULL,
    project    TEXT    NOT NULL,
    session_id TEXT,
    seq        INTEGER NOT NULL,
    at_ms      INTEGER NOT NULL,
    data       TEXT    NOT NULL
);

-- deliveries: one per event and webhook, written with the event; a host
-- claims a due one (claimed_by, claimed_until), posts it, and records the
-- outcome: delivered, or the next attempt's time with the last error.
CREATE TABLE deliveries (
    event_id      TEXT    NOT NULL,
    webhook_id    TEXT    NOT NULL,
    attempts      INTEGER NOT NULL DEFAULT 0,
    next_ms       INTEGER NOT NULL,
    delivered_ms  INTEGER,
    failed_ms     INTEGER,
    last_status   INTEGER,
    last_error    TEXT,
    claimed_by    TEXT,
    claimed_until INTEGER,
    PRIMARY KEY (event_id, webhook_id)
);
CREATE INDEX deliveries_due ON deliveries (next_ms)
    WHERE delivered_ms IS NULL AND failed_ms IS NULL;
CREATE INDEX deliveries_webhook ON deliveries (webhook_id, event_id);
