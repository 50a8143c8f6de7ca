-- Several hosts on one database (DESIGN.md, "Several hosts on one Postgres").
--
-- leases: which host is a session's single writer. A host holds a lease
-- while it runs the session's actor and renews every lease it holds
-- together; another host may take a lease only once it has expired by the
-- database's clock (one clock for every host). A released lease keeps its
-- holder with an expiry in the past, so a late commit of the old holder is
-- still refused after another host took over and let go again. A lease
-- changes hands only under the host row's lock, which every append holds;
-- an append skips the envelopes of sessions another host holds: a host
-- that lost its lease cannot write.
CREATE TABLE leases (
    session_id TEXT        PRIMARY KEY,
    holder     TEXT        NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL
);
CREATE INDEX leases_holder ON leases (holder);

-- forwards: a write a host received for a session another host holds,
-- carried to the holder through the database (no host talks to another
-- directly). The holder claims it, runs it through the session's actor
-- and writes the answer; the sender collects the answer and deletes the
-- row. NOTIFY on tether_forward / tether_answer (payload: the host to wake)
-- only wakes hosts up; both sides also poll.
CREATE TABLE forwards (
    id         BIGSERIAL   PRIMARY KEY,
    session_id TEXT        NOT NULL,
    holder     TEXT        NOT NULL,
    sender     TEXT        NOT NULL,
    request    TEXT        NOT NULL,
    claimed    BOOLEAN     NOT NULL DEFAULT FALSE,
    answer     TEXT,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX forwards_holder ON forwards (holder) WHERE NOT claimed;
CREATE INDEX forwards_sender ON forwards (sender) WHERE answer IS NOT NULL;
