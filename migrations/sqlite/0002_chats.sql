-- Which session owns each chat, so a chat channel finds its session actor
-- even before the chat has an envelope of its own.
CREATE TABLE chats (
    chat       TEXT PRIMARY KEY,
    session_id TEXT NOT NULL
);
