-- The usage ledger: what each usage report of an agent added to its
-- session's totals (tokens, and cost in millionths of its currency, so sums
-- are exact), with who started the turn, the agent and the model, written
-- in the transaction that appends the report. `GET /v1/usage` sums it.
CREATE TABLE usage (
    seq           BIGINT  PRIMARY KEY,
    session_id    TEXT    NOT NULL,
    project       TEXT    NOT NULL,
    agent         TEXT    NOT NULL,
    model         TEXT    NOT NULL,
    sub           TEXT    NOT NULL,
    at_ms         BIGINT  NOT NULL,
    input_tokens  BIGINT  NOT NULL,
    output_tokens BIGINT  NOT NULL,
    cost_micros   BIGINT  NOT NULL,
    currency      TEXT    NOT NULL
);
CREATE INDEX usage_recent ON usage (at_ms);
CREATE INDEX usage_project_recent ON usage (project, at_ms);
CREATE INDEX usage_session ON usage (session_id);
