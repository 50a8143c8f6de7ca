-- Retention deletes a session's refused dispatches by their channels;
-- keyed by their origin, they were read whole for each session it deleted.
-- A refusal is rare, and writes one more index entry.
CREATE INDEX rejections_channel ON rejections (channel);
