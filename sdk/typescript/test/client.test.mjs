// The SDK against the real binary, on SQLite and (when configured) Postgres:
// subscribe and dispatch, a cut connection resumes with no gap and no
// duplicate, a retried action applies once, a token refreshed mid-stream.
//
//   TETHER_BIN=../../target/debug/tether npm test

import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import WebSocket from "ws";
import { AhpClient, RestClient, Tether, TetherError, RpcError, sessionChannel } from "../dist/index.js";
import { backends, startServer, until } from "./server.mjs";

/** An in-memory identity store, as a page's localStorage would keep it. */
function memoryIdentity(initial) {
  let kept = initial;
  return { load: () => kept && { ...kept }, save: (identity) => (kept = { ...identity }), get: () => kept };
}

async function newSession(rest, id, title = "SDK") {
  const dir = mkdtempSync(join(tmpdir(), "tether-sdk-project-"));
  return rest.createSession({ id, title, workingDirectories: [dir] });
}

/** Every envelope of the session's channel, from the transcript. */
async function transcriptSeqs(rest, id, after = 0) {
  const seqs = [];
  for await (const envelope of rest.envelopes(id, after)) {
    if (envelope.channel === sessionChannel(id)) seqs.push(envelope.serverSeq);
  }
  return seqs;
}

for (const backend of backends()) {
  test(`${backend}: subscribe, dispatch, and the typed REST client`, async () => {
    const server = await startServer({ backend });
    const tether = new Tether({ url: server.base, WebSocket });
    try {
      const created = await newSession(tether.rest, "sdk-basic", "Before");
      assert.equal(created.id, "sdk-basic");
      await tether.ahp.connect();
      const snapshot = await tether.ahp.subscribe(sessionChannel("sdk-basic"));
      assert.equal(snapshot.resource, sessionChannel("sdk-basic"));
      const seen = [];
      tether.ahp.on("envelope", (envelope) => seen.push(envelope));

      const outcome = await tether.ahp.dispatch(sessionChannel("sdk-basic"), { type: "session/titleChanged", title: "After" });
      assert.equal(outcome.accepted, true);
      assert.ok(outcome.envelope.serverSeq > snapshot.fromSeq);
      assert.equal(outcome.envelope.origin.clientId, tether.ahp.clientId);
      await until(() => seen.length === 1, 5_000, "the echo");
      assert.equal(seen[0].serverSeq, outcome.envelope.serverSeq);
      assert.equal((await tether.rest.session("sdk-basic")).title, "After");

      // A refusal is an outcome, not an exception: a title must be a string.
      const refused = await tether.ahp.dispatch(sessionChannel("sdk-basic"), { type: "session/titleChanged", title: 7 });
      assert.equal(refused.accepted, false);
      assert.match(refused.reason, /title/i);

      // A channel that does not exist is an error (not AHP's silence).
      await assert.rejects(tether.ahp.dispatch(sessionChannel("no-such-session"), { type: "session/titleChanged", title: "x" }), RpcError);

      // REST errors carry the problem document.
      await assert.rejects(tether.rest.session("no-such-session"), (error) => error instanceof TetherError && error.status === 404 && error.problem.code === "not_found");
      // The export: every envelope as a JSON line, and the conversation as Markdown.
      const lines = (await tether.rest.export("sdk-basic")).trim().split("\n").map((line) => JSON.parse(line));
      assert.deepEqual(lines.map((e) => e.serverSeq), (await tether.rest.transcript("sdk-basic", { limit: 1000 })).envelopes.map((e) => e.serverSeq));
      assert.match(await tether.rest.export("sdk-basic", "markdown"), /^# After\n/);
      const page = await tether.rest.sessions({ limit: 10 });
      assert.ok(page.items.some((s) => s.id === "sdk-basic"));
      // Search finds the title just committed, with its place and a snippet.
      const title = await tether.ahp.dispatch(sessionChannel("sdk-basic"), { type: "session/titleChanged", title: "Kumquat <b>harvest</b>" });
      const found = await tether.rest.search({ q: "kumquat" });
      assert.deepEqual(found.items.map((h) => [h.sessionId, h.kind, h.seq]), [["sdk-basic", "title", title.envelope.serverSeq]]);
      assert.equal(found.items[0].snippetHtml, "<mark>Kumquat</mark> &lt;b&gt;harvest&lt;/b&gt;");
      await assert.rejects(tether.rest.search({ q: "  " }), (error) => error instanceof TetherError && error.status === 422);
    } finally {
      tether.ahp.close();
      await server.stop();
    }
  });

  test(`${backend}: a cut connection resumes with no gap and no duplicate`, async () => {
    const server = await startServer({ backend });
    const rest = new RestClient({ baseUrl: server.base });
    const reader = new AhpClient({ url: server.base, WebSocket, backoff: { initialMs: 20, maxMs: 200 } });
    const writer = new AhpClient({ url: server.base, WebSocket });
    try {
      await newSession(rest, "sdk-cut");
      const channel = sessionChannel("sdk-cut");
      await Promise.all([reader.connect(), writer.connect()]);
      const snapshot = await reader.subscribe(channel);
      const delivered = [];
      let resumes = 0;
      reader.on("envelope", (envelope) => delivered.push(envelope.serverSeq));
      reader.on("resumed", () => (resumes += 1));

      // Three rounds of 100 writes; in each, the reader's connection is cut
      // after the 50th, while the writes go on.
      for (let round = 0; round < 3; round++) {
        const writes = [];
        for (let i = 0; i < 100; i++) {
          writes.push(writer.dispatch(channel, { type: "session/titleChanged", title: `t${round}.${i}` }));
          if (i === 50) reader.drop("cut by the test");
        }
        const outcomes = await Promise.all(writes);
        assert.ok(outcomes.every((o) => o.accepted));
        await until(() => reader.state.kind === "connected" && resumes === round + 1, 10_000, `resume ${round + 1}`);
      }
      const expected = await transcriptSeqs(rest, "sdk-cut", snapshot.fromSeq);
      await until(() => delivered.length >= expected.length, 10_000, "the reader to catch up");
      assert.equal(resumes, 3);
      assert.deepEqual(delivered, expected, "the reader saw exactly the transcript, in order");
    } finally {
      reader.close();
      writer.close();
      await server.stop();
    }
  });

  test(`${backend}: a retried action applies once`, async () => {
    const server = await startServer({ backend });
    const rest = new RestClient({ baseUrl: server.base });
    const identity = memoryIdentity();
    const first = new AhpClient({ url: server.base, WebSocket, identity, backoff: { initialMs: 20, maxMs: 100 } });
    try {
      await newSession(rest, "sdk-retry");
      const channel = sessionChannel("sdk-retry");
      await first.connect();

      // Sent, then the connection is cut before the echo can come back: the
      // client sends it again on the next connection, with the same number.
      const pending = first.dispatch(channel, { type: "session/titleChanged", title: "once" });
      first.drop("cut before the echo");
      const outcome = await pending;
      assert.equal(outcome.accepted, true);

      // A process that crashed after sending and before it knew the outcome
      // sends the same (clientId, clientSeq) again: the original answers.
      const { clientId, lastSeq } = identity.get();
      first.close();
      const second = new AhpClient({ url: server.base, WebSocket, identity: memoryIdentity({ clientId, lastSeq: lastSeq - 1 }) });
      try {
        await second.connect();
        const retried = await second.dispatch(channel, { type: "session/titleChanged", title: "once" });
        assert.equal(retried.accepted, true);
        assert.equal(retried.envelope.serverSeq, outcome.envelope.serverSeq, "the retry answers the original envelope");
      } finally {
        second.close();
      }
      let applied = 0;
      for await (const envelope of rest.envelopes("sdk-retry")) {
        if (envelope.action.type === "session/titleChanged" && envelope.action.title === "once") applied += 1;
      }
      assert.equal(applied, 1, "the action is in the transcript once");
    } finally {
      first.close();
      await server.stop();
    }
  });

  test(`${backend}: tokens are refreshed before they expire, mid-stream, with nothing missed`, async () => {
    const server = await startServer({ backend, auth: true });
    const admin = server.mint({ ttl: "1h" });
    const rest = new RestClient({ baseUrl: server.base, token: admin });
    let minted = 0;
    const states = [];
    // Tokens that live 3 s: the stream must outlive several of them.
    const reader = new AhpClient({
      url: server.base,
      WebSocket,
      token: () => {
        minted += 1;
        return server.mint({ sub: "short-lived", role: "viewer", ttl: "3s" });
      },
    });
    const writer = new AhpClient({ url: server.base, WebSocket, token: admin });
    try {
      await newSession(rest, "sdk-refresh");
      const channel = sessionChannel("sdk-refresh");
      reader.on("state", (state) => states.push(state));
      await Promise.all([reader.connect(), writer.connect()]);
      const snapshot = await reader.subscribe(channel);
      const delivered = [];
      reader.on("envelope", (envelope) => delivered.push(envelope.serverSeq));
      const deadline = Date.now() + 8_000;
      let i = 0;
      while (Date.now() < deadline) {
        const outcome = await writer.dispatch(channel, { type: "session/titleChanged", title: `r${i++}` });
        assert.equal(outcome.accepted, true);
        await new Promise((r) => setTimeout(r, 50));
      }
      const expected = await transcriptSeqs(rest, "sdk-refresh", snapshot.fromSeq);
      await until(() => delivered.length >= expected.length, 10_000, "the reader to catch up");
      assert.deepEqual(delivered, expected, "nothing missed or doubled across refreshes");
      assert.ok(minted >= 3, `${minted} tokens were minted over 8 s of 3 s tokens`);
      assert.ok(!states.some((s) => s.kind === "unauthorized"), "never refused");
      const expiredCloses = states.filter((s) => s.kind === "reconnecting" && /expired/.test(s.reason));
      assert.equal(expiredCloses.length, 0, "the server never had to close for an expired token");
      // A viewer may read but not write: its dispatch is refused.
      const refused = await reader.dispatch(channel, { type: "session/titleChanged", title: "viewer" }).catch((e) => e);
      assert.ok(refused instanceof RpcError || refused.accepted === false, "a viewer's dispatch is refused");
    } finally {
      reader.close();
      writer.close();
      await server.stop();
    }
  });
}
