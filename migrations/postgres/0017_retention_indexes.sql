-- Retention deletes a session's rows by their channels: its own, its
-- chats', and its changesets' and terminals' ('ahp-changeset:/<id>/...',
-- 'ahp-terminal:/<id>/...') by prefix. Under the database's collation a
-- prefix is no range of log_channel's keys, so each deleted session read
-- the whole log (and the snapshots) with the host row, and so every
-- append, locked. These partial indexes hold those channels alone, in byte
-- order ("C"), where a prefix is a range; rows on sessions' and chats'
-- channels, nearly all of them, are not in them and cost no more to write.
CREATE INDEX log_under_session ON log (channel COLLATE "C")
    WHERE channel LIKE 'ahp-changeset:%' OR channel LIKE 'ahp-terminal:%';
CREATE INDEX snapshots_under_session ON snapshots (channel COLLATE "C")
    WHERE channel LIKE 'ahp-changeset:%' OR channel LIKE 'ahp-terminal:%';
-- Refused dispatches were read whole too (keyed by their origin); a
-- refusal is rare, and writes one more index entry.
CREATE INDEX rejections_channel ON rejections (channel);
CREATE INDEX rejections_under_session ON rejections (channel COLLATE "C")
    WHERE channel LIKE 'ahp-changeset:%' OR channel LIKE 'ahp-terminal:%';
