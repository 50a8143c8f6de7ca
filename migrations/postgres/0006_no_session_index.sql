-- The log loses its session index, as SQLite's did (its 0005): every row of
-- a session is on the session's channel or on one of its chats, so a
-- transcript reads those channels through log_channel. Each index of the
-- log is written by every group commit; log_session and log_channel
-- indexed nearly the same keys.
--
-- Chats created before the chats table existed are recorded first, from
-- the log itself (through log_session, while it still exists).
INSERT INTO chats (chat, session_id)
    SELECT DISTINCT channel, session_id FROM log
    WHERE session_id IS NOT NULL AND channel <> 'ahp-session:/' || session_id
    ON CONFLICT (chat) DO NOTHING;
DROP INDEX log_session;
