-- A session's chats, found by an index: loading a session (each new
-- session's actor does, as does every transcript read) listed its chats
-- by reading the whole table, so creating a session got slower as
-- sessions accumulated.
CREATE INDEX chats_session ON chats (session_id);
