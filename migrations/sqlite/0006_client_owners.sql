-- Who registered each client's tools in a session (DESIGN.md, "Client
-- tools are owned by (principal, clientId), durably"): written in the
-- transaction of the session/activeClientSet that registers them, read when
-- the session is loaded, so the host context of a tool call and the right
-- to answer it stay with that principal across evictions, restarts and
-- hosts.
CREATE TABLE client_owners (
    session_id TEXT NOT NULL,
    client_id  TEXT NOT NULL,
    sub        TEXT NOT NULL,
    PRIMARY KEY (session_id, client_id)
);
