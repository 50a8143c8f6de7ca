-- Origins are scoped as AHP scopes them (DESIGN.md, invariant 3): a plain
-- AHP client numbers clientSeq per connection, so its origins are keyed by a
-- per-connection scope; durable origins (REST, the SDK's persistent
-- identity) have the empty scope and are unique for good.
-- A constant default: adding the column rewrites no rows.
ALTER TABLE log ADD COLUMN origin_scope TEXT NOT NULL DEFAULT '';
DROP INDEX log_origin;
CREATE UNIQUE INDEX log_origin ON log (client_id, origin_scope, client_seq);

ALTER TABLE rejections ADD COLUMN origin_scope TEXT NOT NULL DEFAULT '';
ALTER TABLE rejections DROP CONSTRAINT rejections_pkey;
ALTER TABLE rejections ADD PRIMARY KEY (client_id, origin_scope, client_seq);
