-- Each host's liveness in one row (DESIGN.md, "Several hosts on one
-- Postgres"). A host renews its own row, not every lease it holds: renewing
-- each lease rewrote one row per live session every third of the lease
-- time, a cost that grew with the number of sessions.
--
-- A lease is held while its row is not released (expires_at 'infinity'
-- from a host of this version; a finite expiry from an older one, which
-- renews it itself) and its holder's row here has not expired. A host
-- killed without warning stops renewing its row, and after one lease time
-- every lease it held may be taken. A released lease keeps its holder
-- (expires_at '-infinity'), so the fence still refuses that holder's late
-- commits.
CREATE TABLE cluster_hosts (
    id         TEXT        PRIMARY KEY,
    expires_at TIMESTAMPTZ NOT NULL
);
