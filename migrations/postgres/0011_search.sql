-- Full-text search over transcripts (DESIGN.md, "Finding, notifying,
-- keeping"). One document per thing a person looks for (a title, a
-- message, an answer, a tool call, the paths it edited, a question), keyed
-- within its session and rewritten as it grows; written in the transaction
-- that appends the envelope it comes from. `body` is the text as said (for
-- snippets); `words` indexes its words, lower-cased and split by Tether the
-- same way as on SQLite, with the `simple` configuration (no stemming, any
-- script).
CREATE TABLE search_docs (
    session_id TEXT     NOT NULL,
    key        TEXT     NOT NULL,
    chat       TEXT,
    turn_id    TEXT,
    kind       TEXT     NOT NULL,
    seq        BIGINT   NOT NULL,
    at_ms      BIGINT   NOT NULL,
    body       TEXT     NOT NULL,
    words      TSVECTOR NOT NULL,
    PRIMARY KEY (session_id, key)
);
CREATE INDEX search_docs_words ON search_docs USING GIN (words);

-- Sessions whose documents predate the index: a host folds each one's
-- transcript once to index it (engine::search), then removes it here.
CREATE TABLE search_pending (
    session_id TEXT PRIMARY KEY
);
INSERT INTO search_pending (session_id) SELECT id FROM sessions;
