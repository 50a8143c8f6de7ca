-- Full-text search over transcripts (DESIGN.md, "Finding, notifying,
-- keeping"). One document per thing a person looks for (a title, a
-- message, an answer, a tool call, the paths it edited, a question), keyed
-- within its session and rewritten as it grows; written in the transaction
-- that appends the envelope it comes from. `body` is the text as said (for
-- snippets); `words` is what is indexed: its words, lower-cased, one space
-- apart, split the same way as on Postgres.
CREATE TABLE search_docs (
    id         INTEGER PRIMARY KEY,
    session_id TEXT    NOT NULL,
    key        TEXT    NOT NULL,
    chat       TEXT,
    turn_id    TEXT,
    kind       TEXT    NOT NULL,
    seq        INTEGER NOT NULL,
    at_ms      INTEGER NOT NULL,
    body       TEXT    NOT NULL,
    words      TEXT    NOT NULL,
    UNIQUE (session_id, key)
);

CREATE VIRTUAL TABLE search_fts USING fts5(
    words,
    content = 'search_docs',
    content_rowid = 'id',
    tokenize = 'unicode61 remove_diacritics 0'
);

CREATE TRIGGER search_docs_added AFTER INSERT ON search_docs BEGIN
    INSERT INTO search_fts (rowid, words) VALUES (new.id, new.words);
END;
CREATE TRIGGER search_docs_removed AFTER DELETE ON search_docs BEGIN
    INSERT INTO search_fts (search_fts, rowid, words) VALUES ('delete', old.id, old.words);
END;
CREATE TRIGGER search_docs_changed AFTER UPDATE OF words ON search_docs BEGIN
    INSERT INTO search_fts (search_fts, rowid, words) VALUES ('delete', old.id, old.words);
    INSERT INTO search_fts (rowid, words) VALUES (new.id, new.words);
END;

-- Sessions whose documents predate the index: the host folds each one's
-- transcript once to index it (engine::search), then removes it here.
CREATE TABLE search_pending (
    session_id TEXT PRIMARY KEY
);
INSERT INTO search_pending (session_id) SELECT id FROM sessions;
