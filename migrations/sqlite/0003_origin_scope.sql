-- Origins are scoped as AHP scopes them (DESIGN.md, invariant 3): a plain
-- AHP client numbers clientSeq per connection, so its origins are keyed by a
-- per-connection scope; durable origins (REST, the SDK's persistent
-- identity) have the empty scope and are unique for good.
ALTER TABLE log ADD COLUMN origin_scope TEXT NOT NULL DEFAULT '';
DROP INDEX log_origin;
CREATE UNIQUE INDEX log_origin ON log (client_id, origin_scope, client_seq);

CREATE TABLE rejections_scoped (
    client_id    TEXT    NOT NULL,
    origin_scope TEXT    NOT NULL DEFAULT '',
    client_seq   INTEGER NOT NULL,
    channel      TEXT    NOT NULL,
    action       TEXT    NOT NULL,
    reason       TEXT    NOT NULL,
    at_ms        INTEGER NOT NULL,
    PRIMARY KEY (client_id, origin_scope, client_seq)
);
INSERT INTO rejections_scoped (client_id, origin_scope, client_seq, channel, action, reason, at_ms)
    SELECT client_id, '', client_seq, channel, action, reason, at_ms FROM rejections;
DROP TABLE rejections;
ALTER TABLE rejections_scoped RENAME TO rejections;
