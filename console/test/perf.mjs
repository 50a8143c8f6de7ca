// The console's two performance figures, measured in headless Chromium
// against the real binary (BENCHMARKS.md, "The console"):
//   1. opening a session whose transcript holds 100,000 envelopes;
//   2. an answer streaming thousands of deltas: how fast they arrive and
//      render, and the longest the page's main thread was blocked.
//
//   TETHER_BIN=target/release/tether TETHER_FAKE_AGENT=target/release/fake-acp-agent \
//     node --experimental-websocket console/test/perf.mjs [ENVELOPES] [DELTAS]

import { spawn } from "node:child_process";
import { mkdtempSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { chromium } from "playwright-core";

const BIN = resolve(process.env.TETHER_BIN ?? "target/release/tether");
const FAKE = resolve(process.env.TETHER_FAKE_AGENT ?? "target/release/fake-acp-agent");
const ENVELOPES = Number(process.argv[2] ?? 100_000);
const DELTAS = Number(process.argv[3] ?? 5_000);
const work = mkdtempSync(join(tmpdir(), "tether-console-perf-"));

const port = await new Promise((done) => {
  const probe = createServer().listen(0, "127.0.0.1", () => {
    const { port } = probe.address();
    probe.close(() => done(port));
  });
});
const base = `http://127.0.0.1:${port}`;
const server = spawn(BIN, ["serve", "--bind", `127.0.0.1:${port}`, "--database-url", `sqlite:${join(work, "t.db")}`,
  "--agent", `fake=${FAKE}`, "--agent-max-updates", "1000000"], { stdio: "ignore" });
for (let i = 0; i < 400; i++) {
  try { if ((await fetch(`${base}/readyz`)).ok) break; } catch {}
  await new Promise((r) => setTimeout(r, 50));
}
const rest = (path, body) => fetch(`${base}${path}`, { method: body ? "POST" : "GET", headers: { "content-type": "application/json" }, body: body && JSON.stringify(body) }).then((r) => r.json());

// 1. A session with ENVELOPES envelopes, written over AHP with 256 in flight.
await rest("/v1/sessions", { id: "big", title: "Big session" });
const seeded = await new Promise((done) => {
  const ws = new WebSocket(`ws://127.0.0.1:${port}/ahp`, ["ahp"]);
  let sent = 0, acked = 0;
  const started = performance.now();
  const pump = () => {
    while (sent < ENVELOPES && sent - acked < 256) {
      sent += 1;
      ws.send(JSON.stringify({ jsonrpc: "2.0", method: "dispatchAction", params: { channel: "ahp-session:/big", clientSeq: sent,
        action: { type: "session/titleChanged", title: `Big session ${sent}` } } }));
    }
  };
  ws.onopen = () => ws.send(JSON.stringify({ jsonrpc: "2.0", id: 1, method: "initialize", params: { protocolVersions: ["1.0.0"], clientId: "seeder" } }));
  ws.onmessage = (event) => {
    const message = JSON.parse(event.data);
    if (message.id === 1) {
      ws.send(JSON.stringify({ jsonrpc: "2.0", id: 2, method: "subscribe", params: { channel: "ahp-session:/big" } }));
    } else if (message.id === 2) {
      pump();
    } else if (message.method === "action" && message.params.origin?.clientId === "seeder") {
      acked += 1;
      if (acked === ENVELOPES) { ws.close(); done(performance.now() - started); } else pump();
    }
  };
});
const view = await rest("/v1/sessions/big");
console.log(`seeded ${ENVELOPES} envelopes in ${(seeded / 1000).toFixed(1)} s (lastSeq ${view.lastSeq})`);

const browser = await chromium.launch({ executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"] });
const page = await (await browser.newContext()).newPage();
await page.addInitScript(() => {
  window.__longest = 0;
  new PerformanceObserver((list) => {
    for (const entry of list.getEntries()) window.__longest = Math.max(window.__longest, entry.duration);
  }).observe({ type: "longtask", buffered: true });
});
await page.goto(base);
await page.getByRole("status").filter({ hasText: "Connected" }).first().waitFor();
const opens = [];
for (let i = 0; i < 5; i++) {
  await page.reload();
  await page.getByRole("status").filter({ hasText: "Connected" }).first().waitFor();
  const session = page.locator('[data-session="big"]');
  await session.waitFor();
  const t0 = Date.now();
  await session.click();
  await page.locator("#projection dd", { hasText: "none" }).first().waitFor();
  await page.getByRole("heading", { name: `Big session ${ENVELOPES}` }).waitFor();
  opens.push(Date.now() - t0);
}
opens.sort((a, b) => a - b);
console.log(`open a ${ENVELOPES}-envelope session: median ${opens[2]} ms, worst ${opens[4]} ms (5 opens)`);

// 2. DELTAS deltas as fast as the agent sends them.
await rest("/v1/sessions", { id: "stream", provider: "fake", title: "Streaming" });
await page.reload();
await page.getByRole("status").filter({ hasText: "Connected" }).first().waitFor();
await page.locator('[data-session="stream"]').click();
await page.getByRole("heading", { name: "Streaming" }).waitFor();
await page.evaluate(() => (window.__longest = 0));
const t0 = Date.now();
await page.getByRole("textbox", { name: "Message" }).fill(`flood ${DELTAS}`);
await page.getByRole("button", { name: "Send", exact: true }).click();
await page.locator('#turns li[data-state="complete"]').waitFor({ timeout: 120_000 });
const elapsed = Date.now() - t0;
const longest = await page.evaluate(() => window.__longest);
const rendered = await page.locator("#turns .answer p").first().textContent();
const ok = rendered.trim().endsWith(`${DELTAS - 1}`);
console.log(`${DELTAS} deltas streamed and rendered in ${elapsed} ms (${Math.round((DELTAS / elapsed) * 1000)}/s), longest main-thread task ${Math.round(longest)} ms, text complete: ${ok}`);
await browser.close();
server.kill("SIGTERM");
process.exit(ok ? 0 : 1);
