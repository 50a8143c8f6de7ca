-- Message attachments (images, files) stored once, outside the envelopes:
-- a turn's embedded attachment is written here before the turn is
-- committed, and the message keeps a reference (its digest). Keyed by
-- session and content digest, so the same bytes sent twice are stored once.
CREATE TABLE attachments (
    session_id   TEXT    NOT NULL,
    digest       TEXT    NOT NULL,
    content_type TEXT    NOT NULL,
    size         INTEGER NOT NULL,
    data         BLOB    NOT NULL,
    created_ms   INTEGER NOT NULL,
    PRIMARY KEY (session_id, digest)
);
