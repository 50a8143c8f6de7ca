# Pages of one session's log read the old way (a page of full rows from every
# channel, merged) and the new way (each channel's first seqs off its index,
# merged, then only the rows up to the page's last seq), on a store shaped
# like Tether's (log keyed by seq, an index on channel_id). One session of
# 400,000 envelopes on its channel, its chat, a terminal and 50 changesets;
# with --plain, on its channel and its chat only (a transcript's shape).
#   python3 bench/sql/session-pages-sqlite.py [--plain] DB_FILE
import sqlite3, time, sys, os
plain = "--plain" in sys.argv
path = [a for a in sys.argv[1:] if a != "--plain"][0]
if not os.path.exists(path):
    db = sqlite3.connect(path)
    db.executescript("""
    CREATE TABLE channels (id INTEGER PRIMARY KEY, uri TEXT NOT NULL UNIQUE);
    CREATE TABLE log (seq INTEGER PRIMARY KEY, channel TEXT NOT NULL, session_id TEXT,
      action TEXT NOT NULL, channel_id INTEGER);
    CREATE INDEX log_channel_id ON log (channel_id);
    """)
    chans = ["ahp-session:/s1", "ahp-chat:/s1.main"]
    if not plain:
        chans += ["ahp-terminal:/s1/console-1"] + ["ahp-changeset:/s1/t%d" % i for i in range(50)]
    db.executemany("INSERT INTO channels (uri) VALUES (?)", [(c,) for c in chans])
    ids = {c: i + 1 for i, c in enumerate(chans)}
    action = '{"type":"chat/responsePart","data":"' + "x" * 300 + '"}'
    rows = []
    for g in range(1, 400001):
        m = g % 8
        if plain:
            c = chans[0] if m == 0 else chans[1]
        else:
            c = chans[0] if m == 0 else chans[1] if m < 4 else chans[2] if m < 7 else chans[3 + g % 50]
        rows.append((g, c, "s1", action, ids[c]))
    db.executemany("INSERT INTO log VALUES (?,?,?,?,?)", rows)
    db.commit()
    db.close()
db = sqlite3.connect(path)
chans = [r[0] for r in db.execute("SELECT uri FROM channels ORDER BY id")]
LIMIT = 1000
def old(after):
    found = []
    for c in chans:
        found += db.execute("SELECT seq, channel, session_id, action FROM log WHERE channel_id = (SELECT id FROM channels WHERE uri = ?) AND seq > ? ORDER BY seq LIMIT ?", (c, after, LIMIT)).fetchall()
    found.sort()
    return found[:LIMIT]
def new(after):
    firsts = []
    for n, c in enumerate(chans):
        firsts += [(s, n) for (s,) in db.execute("SELECT seq FROM log WHERE channel_id = (SELECT id FROM channels WHERE uri = ?) AND seq > ? ORDER BY seq LIMIT ?", (c, after, LIMIT))]
    firsts.sort()
    firsts = firsts[:LIMIT]
    if not firsts:
        return []
    last = firsts[-1][0]
    found = []
    for n in sorted({n for _, n in firsts}):
        found += db.execute("SELECT seq, channel, session_id, action FROM log WHERE channel_id = (SELECT id FROM channels WHERE uri = ?) AND seq > ? AND seq <= ? ORDER BY seq", (chans[n], after, last)).fetchall()
    found.sort()
    return found
for name, f in [("old", old), ("new", new), ("old", old), ("new", new)]:
    t = time.perf_counter(); after = 0; pages = 0; n = 0
    while True:
        page = f(after)
        if not page: break
        pages += 1; n += len(page); after = page[-1][0]
    print(f"{name}: {n} envelopes in {pages} pages, {time.perf_counter() - t:.2f} s")
assert old(123456) == new(123456)
