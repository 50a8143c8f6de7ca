-- Three statements for a page of one session's log, as the export read it
-- in this stop: `channels_by_their_rows` (aa7cb0f: the changeset and
-- terminal channels found by reading all their rows), `rows_of_every_channel`
-- (2a0d172: found by skipping through their index, then a page of full rows
-- read from every channel and merged), `seqs_first` (9106224: each
-- channel's first seqs off log_channel, the page ending at the limit-th of
-- them all, then only the rows up to it). The timings below run the last
-- two; the first is prepared for comparison by hand. On a log shaped as
-- Tether's: one session of 400,000 envelopes on its channel, its chat, a
-- terminal and 50 changesets. Run with
--   psql -h 127.0.0.1 -U postgres -c 'CREATE DATABASE tether_pages'
--   psql -h 127.0.0.1 -U postgres tether_pages -f bench/sql/session-pages-postgres.sql
\set QUIET on
DROP TABLE IF EXISTS log, chats;
CREATE TABLE log (seq bigint PRIMARY KEY, channel text NOT NULL, session_id text,
  action text NOT NULL, client_id text, client_seq bigint, at_ms bigint NOT NULL,
  origin_scope text NOT NULL DEFAULT '');
CREATE INDEX log_channel ON log (channel, seq);
CREATE INDEX log_under_session ON log (channel COLLATE "C")
  WHERE channel LIKE 'ahp-changeset:%' OR channel LIKE 'ahp-terminal:%';
CREATE TABLE chats (chat text PRIMARY KEY, session_id text NOT NULL);
CREATE INDEX chats_session ON chats (session_id);
INSERT INTO chats VALUES ('ahp-chat:/s1.main', 's1');
INSERT INTO log (seq, channel, session_id, action, at_ms)
SELECT g, CASE WHEN g % 4 = 0 THEN 'ahp-chat:/s1.main' WHEN g % 4 = 1 THEN 'ahp-terminal:/s1/console-1'
               WHEN g % 4 = 2 THEN 'ahp-changeset:/s1/t' || (g % 50) ELSE 'ahp-session:/s1' END,
       's1', '{"type":"x"}', 0
FROM generate_series(1, 400000) g;
VACUUM ANALYZE log;
PREPARE channels_by_their_rows(text,text,bigint,bigint) AS
SELECT l.seq FROM (SELECT $1::text AS channel UNION SELECT chat FROM chats WHERE session_id = $2
 UNION SELECT channel FROM log WHERE ((channel LIKE 'ahp-changeset:%' OR channel LIKE 'ahp-terminal:%') AND channel COLLATE "C" > 'ahp-changeset:/' || $2 || '/' AND channel COLLATE "C" < 'ahp-changeset:/' || $2 || '0')
 UNION SELECT channel FROM log WHERE ((channel LIKE 'ahp-changeset:%' OR channel LIKE 'ahp-terminal:%') AND channel COLLATE "C" > 'ahp-terminal:/' || $2 || '/' AND channel COLLATE "C" < 'ahp-terminal:/' || $2 || '0')) AS c
 CROSS JOIN LATERAL (SELECT * FROM log WHERE log.channel = c.channel AND log.seq > $3 AND log.session_id = $2 ORDER BY log.seq LIMIT $4) AS l ORDER BY l.seq LIMIT $4;
PREPARE rows_of_every_channel(text,text,bigint,bigint) AS
WITH RECURSIVE changesets(channel) AS (
  SELECT min(channel COLLATE "C") FROM log WHERE ((channel LIKE 'ahp-changeset:%' OR channel LIKE 'ahp-terminal:%') AND channel COLLATE "C" > 'ahp-changeset:/' || $2 || '/' AND channel COLLATE "C" < 'ahp-changeset:/' || $2 || '0')
  UNION ALL SELECT (SELECT min(l.channel COLLATE "C") FROM log l WHERE ((l.channel LIKE 'ahp-changeset:%' OR l.channel LIKE 'ahp-terminal:%') AND l.channel COLLATE "C" > 'ahp-changeset:/' || $2 || '/' AND l.channel COLLATE "C" < 'ahp-changeset:/' || $2 || '0') AND l.channel COLLATE "C" > k.channel) FROM changesets k WHERE k.channel IS NOT NULL),
terminals(channel) AS (
  SELECT min(channel COLLATE "C") FROM log WHERE ((channel LIKE 'ahp-changeset:%' OR channel LIKE 'ahp-terminal:%') AND channel COLLATE "C" > 'ahp-terminal:/' || $2 || '/' AND channel COLLATE "C" < 'ahp-terminal:/' || $2 || '0')
  UNION ALL SELECT (SELECT min(l.channel COLLATE "C") FROM log l WHERE ((l.channel LIKE 'ahp-changeset:%' OR l.channel LIKE 'ahp-terminal:%') AND l.channel COLLATE "C" > 'ahp-terminal:/' || $2 || '/' AND l.channel COLLATE "C" < 'ahp-terminal:/' || $2 || '0') AND l.channel COLLATE "C" > k.channel) FROM terminals k WHERE k.channel IS NOT NULL)
SELECT l.seq FROM (SELECT $1::text AS channel UNION SELECT chat FROM chats WHERE session_id = $2
 UNION SELECT channel COLLATE "default" FROM changesets WHERE channel IS NOT NULL
 UNION SELECT channel COLLATE "default" FROM terminals WHERE channel IS NOT NULL) AS c
 CROSS JOIN LATERAL (SELECT * FROM log WHERE log.channel = c.channel AND log.seq > $3 AND log.session_id = $2 ORDER BY log.seq LIMIT $4) AS l ORDER BY l.seq LIMIT $4;
PREPARE seqs_first(text,text,bigint,bigint) AS
WITH RECURSIVE changesets(channel) AS (
  SELECT min(channel COLLATE "C") FROM log WHERE ((channel LIKE 'ahp-changeset:%' OR channel LIKE 'ahp-terminal:%') AND channel COLLATE "C" > 'ahp-changeset:/' || $2 || '/' AND channel COLLATE "C" < 'ahp-changeset:/' || $2 || '0')
  UNION ALL SELECT (SELECT min(l.channel COLLATE "C") FROM log l WHERE ((l.channel LIKE 'ahp-changeset:%' OR l.channel LIKE 'ahp-terminal:%') AND l.channel COLLATE "C" > 'ahp-changeset:/' || $2 || '/' AND l.channel COLLATE "C" < 'ahp-changeset:/' || $2 || '0') AND l.channel COLLATE "C" > k.channel) FROM changesets k WHERE k.channel IS NOT NULL),
terminals(channel) AS (
  SELECT min(channel COLLATE "C") FROM log WHERE ((channel LIKE 'ahp-changeset:%' OR channel LIKE 'ahp-terminal:%') AND channel COLLATE "C" > 'ahp-terminal:/' || $2 || '/' AND channel COLLATE "C" < 'ahp-terminal:/' || $2 || '0')
  UNION ALL SELECT (SELECT min(l.channel COLLATE "C") FROM log l WHERE ((l.channel LIKE 'ahp-changeset:%' OR l.channel LIKE 'ahp-terminal:%') AND l.channel COLLATE "C" > 'ahp-terminal:/' || $2 || '/' AND l.channel COLLATE "C" < 'ahp-terminal:/' || $2 || '0') AND l.channel COLLATE "C" > k.channel) FROM terminals k WHERE k.channel IS NOT NULL),
c AS MATERIALIZED (SELECT $1::text AS channel UNION SELECT chat FROM chats WHERE session_id = $2
 UNION SELECT channel COLLATE "default" FROM changesets WHERE channel IS NOT NULL
 UNION SELECT channel COLLATE "default" FROM terminals WHERE channel IS NOT NULL),
bound AS (SELECT max(f.seq) AS last FROM (SELECT s.seq FROM c CROSS JOIN LATERAL (SELECT seq FROM log WHERE log.channel = c.channel AND log.seq > $3 ORDER BY log.seq LIMIT $4) s ORDER BY s.seq LIMIT $4) f)
SELECT l.seq FROM c CROSS JOIN LATERAL (SELECT * FROM log WHERE log.channel = c.channel AND log.seq > $3 AND log.seq <= (SELECT last FROM bound) AND log.session_id = $2) AS l ORDER BY l.seq;
SET plan_cache_mode = force_generic_plan;
\o /dev/null
\timing on
\echo rows_of_every_channel, pages after 0, 100000, 200000, 300000, 399000
EXECUTE rows_of_every_channel('ahp-session:/s1', 's1', 0, 1000);
EXECUTE rows_of_every_channel('ahp-session:/s1', 's1', 100000, 1000);
EXECUTE rows_of_every_channel('ahp-session:/s1', 's1', 200000, 1000);
EXECUTE rows_of_every_channel('ahp-session:/s1', 's1', 300000, 1000);
EXECUTE rows_of_every_channel('ahp-session:/s1', 's1', 399000, 1000);
\echo seqs_first, the same pages
EXECUTE seqs_first('ahp-session:/s1', 's1', 0, 1000);
EXECUTE seqs_first('ahp-session:/s1', 's1', 100000, 1000);
EXECUTE seqs_first('ahp-session:/s1', 's1', 200000, 1000);
EXECUTE seqs_first('ahp-session:/s1', 's1', 300000, 1000);
EXECUTE seqs_first('ahp-session:/s1', 's1', 399000, 1000);
