-- Turns moved out of a chat's loaded window (AHP 1.0 turnsNextCursor):
-- live state and snapshots keep the most recent turns, fetchTurns loads
-- older ones from here. Written in the transaction of the envelope whose
-- fold moved them out; a reload re-derives and upserts any that are
-- missing, so the table is a cache of the log, never the only copy.
CREATE TABLE chat_turns (
    chat       TEXT   NOT NULL,
    generation INTEGER NOT NULL,
    ordinal    INTEGER NOT NULL,
    turn_id    TEXT   NOT NULL,
    body       TEXT   NOT NULL,
    PRIMARY KEY (chat, generation, ordinal)
);
CREATE INDEX chat_turns_id ON chat_turns (chat, generation, turn_id);
