// End-to-end test of the console in headless Chromium (Debian's package,
// driven by playwright-core) against the real `tether` binary. Each step
// saves a screenshot under $TETHER_E2E_OUT (default target/console-e2e).
//
//   TETHER_BIN=target/debug/tether TETHER_FAKE_AGENT=target/debug/fake-acp-agent \
//     node console/test/e2e.mjs
//
// Bounded: every wait has a timeout, and the whole run is given 180 s.

import { spawn } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { chromium } from "playwright-core";

const BIN = resolve(process.env.TETHER_BIN ?? "target/debug/tether");
const FAKE = resolve(process.env.TETHER_FAKE_AGENT ?? "target/debug/fake-acp-agent");
const OUT = resolve(process.env.TETHER_E2E_OUT ?? "target/console-e2e");
const CHROMIUM = process.env.CHROMIUM ?? "/usr/bin/chromium";
const DATABASE = process.env.TETHER_E2E_DATABASE_URL || undefined; // default: a fresh SQLite file
const WAIT = 15_000;
const AXE = readFileSync(createRequire(import.meta.url).resolve("axe-core/axe.min.js"), "utf8");

/** axe-core's serious and critical violations on the page as it is. */
async function accessibility(page, name) {
  // Evaluated through the debugging protocol: the console's CSP allows no
  // inline script, and is not loosened for the test.
  await page.evaluate(AXE);
  const found = await page.evaluate(async () => (await globalThis.axe.run(document, { resultTypes: ["violations"] })).violations
    .filter((v) => v.impact === "serious" || v.impact === "critical")
    .map((v) => `${v.id} (${v.impact}): ${v.nodes.map((n) => n.target.join(" ")).slice(0, 3).join(", ")}`));
  assert(found.length === 0, `axe-core on ${name}: ${found.join("; ")}`);
}

/** The answer of the last turn, once complete. */
const lastAnswer = (page, text) => page.locator('#turns li[data-state="complete"] .answer', { hasText: text }).last();

async function say(page, text) {
  await page.getByRole("textbox", { name: "Message" }).fill(text);
  await page.getByRole("button", { name: "Send", exact: true }).click();
}

mkdirSync(OUT, { recursive: true });
const work = mkdtempSync(join(tmpdir(), "tether-console-"));
setTimeout(() => fail("the run took longer than 180 s"), 180_000).unref();

let server = null;
let browser = null;
let step = 0;

function fail(message) {
  console.error(`console e2e FAILED: ${message}`);
  server?.kill("SIGKILL");
  browser?.close().catch(() => {});
  process.exit(1);
}

function assert(condition, message) {
  if (!condition) fail(message);
}

async function freePort() {
  return new Promise((done) => {
    const probe = createServer().listen(0, "127.0.0.1", () => {
      const { port } = probe.address();
      probe.close(() => done(port));
    });
  });
}

const port = await freePort();
const base = `http://127.0.0.1:${port}`;
const database = DATABASE ?? `sqlite:${join(work, "tether.db")}`;

async function start(extra = []) {
  const args = ["serve", "--bind", `127.0.0.1:${port}`, "--database-url", database,
    "--agent", `fake=FAKE_ACP_CAPS=load,config,image ${FAKE}`, ...extra];
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("TETHER_")));
  server = spawn(BIN, args, { env, stdio: ["ignore", "ignore", "pipe"] });
  let log = "";
  server.stderr.on("data", (chunk) => {
    log += chunk;
    serverLog = (serverLog + chunk).slice(-20_000);
  });
  for (let i = 0; i < 200; i++) {
    try {
      if ((await fetch(`${base}/readyz`)).ok) return;
    } catch {}
    await new Promise((r) => setTimeout(r, 50));
  }
  fail(`the server did not start:\n${log}`);
}

/** The server's latest log, and what the pages said and failed to load: printed when the test fails. */
let serverLog = "";
const seen = [];

/** `browser` with every new context's console, failed requests and error answers recorded in `seen`. */
function watched(browser) {
  const newContext = browser.newContext.bind(browser);
  browser.newContext = async (...args) => {
    const context = await newContext(...args);
    const index = browser.contexts().length - 1;
    const note = (what) => seen.push(`${new Date().toISOString()} [page ${index}] ${what}`);
    context.on("console", (message) => note(`console.${message.type()}: ${message.text()}`));
    context.on("requestfailed", (request) => note(`request failed: ${request.method()} ${request.url()} (${request.failure()?.errorText})`));
    context.on("response", (response) => response.status() >= 400 && note(`answer ${response.status()}: ${response.request().method()} ${response.url()}`));
    return context;
  };
  return browser;
}

async function stop(signal = "SIGKILL") {
  const exited = new Promise((done) => server.once("exit", done));
  server.kill(signal);
  await exited;
}

async function rest(path, init = {}, token) {
  const headers = { "content-type": "application/json" };
  if (token) headers.authorization = `Bearer ${token}`;
  const response = await fetch(`${base}${path}`, { ...init, headers });
  return { status: response.status, body: await response.json().catch(() => null) };
}

async function shot(page, name) {
  step += 1;
  await page.screenshot({ path: join(OUT, `${String(step).padStart(2, "0")}-${name}.png`), fullPage: true });
}

const connected = (page) => page.getByRole("status").filter({ hasText: "Connected" }).first().waitFor({ timeout: WAIT });

/** The seqs the page rendered, in order. */
const renderedSeqs = (page) =>
  page.$$eval("#envelopes li", (rows) => rows.map((r) => Number(r.getAttribute("data-seq"))));

try {
  await start();
  browser = watched(await chromium.launch({
    executablePath: CHROMIUM,
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  }));
  const page = await (await browser.newContext()).newPage();
  page.on("pageerror", (error) => fail(`the page threw: ${error.message}`));
  await page.goto(base);
  await connected(page);
  await shot(page, "connected");

  // A session created over REST appears live in the open console.
  const dir = mkdtempSync(join(work, "project-"));
  const created = await rest("/v1/sessions", { method: "POST", body: JSON.stringify({ id: "e2e", title: "From REST", workingDirectories: [dir] }) });
  assert(created.status === 201, `create: ${created.status}`);
  const listed = page.locator('[data-session="e2e"]');
  await listed.waitFor({ timeout: WAIT });
  await shot(page, "listed-live");
  await listed.click();
  await page.getByRole("heading", { name: "From REST" }).waitFor({ timeout: WAIT });

  // A second browser context sees the same stream.
  const other = await (await browser.newContext()).newPage();
  await other.goto(base);
  await connected(other);
  // The list refreshes between the press and the release: the click still
  // opens the session (a refresh that took the button out and put it
  // back lost the click, now and then, in CI).
  const entry = await other.locator('[data-session="e2e"]').boundingBox();
  await other.mouse.move(entry.x + entry.width / 2, entry.y + entry.height / 2);
  await other.mouse.down();
  await other.evaluate(() => new Promise((done) => {
    const seen = new MutationObserver(() => {
      seen.disconnect();
      done();
    });
    seen.observe(document.querySelector("#session-list"), { childList: true, subtree: true });
    document.querySelector("#filters").dispatchEvent(new Event("input", { bubbles: true }));
  }));
  await other.mouse.up();
  await other.getByRole("heading", { name: "From REST" }).waitFor({ timeout: WAIT });

  // A turn: the echo agent's answer streams in, on both pages.
  await page.getByRole("textbox", { name: "Message" }).fill("hello from the browser");
  await page.getByRole("button", { name: "Send", exact: true }).click();
  for (const p of [page, other]) {
    await p.locator('#turns li[data-state="complete"] .answer', { hasText: "hello from the browser" }).waitFor({ timeout: WAIT });
  }
  await shot(page, "echo-answer");

  // Markdown, sanitised, with a highlighted code block.
  await say(page, "Some **bold** words <img src=x onerror=alert(1)> <textarea id=\"message\">not yours</textarea>\n\n```js\nconst answer = 42;\n```");
  await lastAnswer(page, "bold").locator("strong", { hasText: "bold" }).waitFor({ timeout: WAIT });
  await lastAnswer(page, "bold").locator("pre.code .hljs-keyword", { hasText: "const" }).waitFor({ timeout: WAIT });
  assert((await lastAnswer(page, "bold").locator("img[onerror]").count()) === 0, "an answer's markup ran unsanitised");
  // An answer cannot put a control of its own in the page, nor take the composer's id.
  assert((await page.locator("#turns .part textarea, #turns .part [id], #turns .user textarea, #turns .user [id]").count()) === 0, "an answer's form control or id reached the page");
  await shot(page, "markdown");

  // A bad working directory shows the server's reason next to the form.
  await page.getByRole("textbox", { name: "Add directory" }).fill("/no/such/directory");
  await page.getByRole("button", { name: "Add", exact: true }).click();
  await page.locator("#add-dir .error", { hasText: "does not exist" }).waitFor({ timeout: WAIT });
  await shot(page, "directory-refused");

  // The primary directory is replaced (echo allows it); the list follows.
  const elsewhere = mkdtempSync(join(work, "other-"));
  await page.getByRole("textbox", { name: "Replacement" }).fill(elsewhere);
  await page.getByRole("button", { name: "Replace", exact: true }).click();
  await page.locator("#dirs code", { hasText: elsewhere }).waitFor({ timeout: WAIT });
  await shot(page, "directory-replaced");

  // The server is killed and restarted: the stream resumes with no gap
  // and no duplicate.
  await stop("SIGKILL");
  await page.getByRole("status").filter({ hasText: "Reconnecting" }).first().waitFor({ timeout: WAIT });
  await shot(page, "reconnecting");
  await start();
  await connected(page);
  await page.getByRole("textbox", { name: "Message" }).fill("after the restart");
  await page.getByRole("button", { name: "Send", exact: true }).click();
  await page.locator('#turns li[data-state="complete"] .answer', { hasText: "after the restart" }).waitFor({ timeout: WAIT });
  const transcript = await rest("/v1/sessions/e2e/transcript?after=0&limit=1000");
  const stored = transcript.body.envelopes.map((e) => e.serverSeq);
  const shown = await renderedSeqs(page);
  const firstShown = shown[0];
  const expected = stored.filter((s) => s >= firstShown);
  assert(JSON.stringify(shown) === JSON.stringify(expected), `rendered ${shown} but the transcript has ${expected}`);
  assert(new Set(shown).size === shown.length, "a duplicate row");
  await shot(page, "resumed-no-gap");

  // An ACP agent asks permission; the person approves it from the page.
  await page.locator("#create-provider").selectOption("fake");
  // Created with a model of its own, chosen from the agent's settings.
  await page.locator('#create-config select[name="model"]').selectOption({ label: "Smart" });
  await page.getByLabel("Working directory").fill(dir);
  // The composer of the session open until now stays on the page while the
  // new one opens: wait for the new session's heading (it has no title, so
  // its id) before writing, or the message goes to the old session.
  const openBefore = await page.locator("#session-title").textContent();
  await page.getByRole("button", { name: "Create session" }).click();
  await page.waitForFunction(
    (before) => {
      const title = document.querySelector("#session-title")?.textContent;
      return Boolean(title) && title !== before && !document.querySelector("#session").hidden;
    },
    openBefore,
    { timeout: WAIT },
  );
  await page.getByRole("textbox", { name: "Message" }).waitFor({ timeout: WAIT });
  await page.getByRole("textbox", { name: "Message" }).fill("permission");
  await page.getByRole("button", { name: "Send", exact: true }).click();
  const allow = page.getByRole("button", { name: "Allow once" });
  await allow.waitFor({ timeout: WAIT });
  await shot(page, "permission-prompt");
  await allow.click();
  await page.locator('#turns li[data-state="complete"] .answer', { hasText: "edited" }).waitFor({ timeout: WAIT });
  await shot(page, "permission-approved");

  // It was created with the model picked in the form; the composer's
  // pickers change it, and the agent has the new one.
  await say(page, "settings");
  await lastAnswer(page, "model=smart").waitFor({ timeout: WAIT });
  const model = page.locator('#config select[name="model"]');
  await model.waitFor({ timeout: WAIT });
  await model.selectOption({ label: "Fast" });
  await say(page, "settings");
  await lastAnswer(page, "model=fast").waitFor({ timeout: WAIT });
  await shot(page, "model-picked");

  // A file edit shows both sides, as a diff.
  writeFileSync(join(dir, "notes.txt"), "one\nthree\n");
  await say(page, `edit ${join(dir, "notes.txt")} one\\ntwo`);
  const edit = page.locator("#turns .edit").last();
  await edit.locator("tr.removed", { hasText: "three" }).waitFor({ timeout: WAIT });
  await edit.locator("tr.added", { hasText: "two" }).waitFor({ timeout: WAIT });
  await edit.locator("tr.kept", { hasText: "one" }).waitFor({ timeout: WAIT });
  await shot(page, "file-edit");

  // Someone watching in a hidden tab (the page is told it is hidden; the
  // browser's Notification is recorded) is told when the agent asks and
  // when the turn ends.
  const watcher = await (await browser.newContext()).newPage();
  await watcher.addInitScript(() => {
    Object.defineProperty(Document.prototype, "hidden", { get: () => true });
    window.__notified = [];
    window.Notification = class {
      static permission = "granted";
      static requestPermission = async () => "granted";
      constructor(title) {
        window.__notified.push(title);
      }
    };
  });
  await watcher.goto(base);
  await connected(watcher);
  await watcher.locator("[data-session]", { hasText: "permission" }).click();
  await watcher.getByRole("heading", { name: "permission" }).waitFor({ timeout: WAIT });

  // The agent asks; the question is answered from the page.
  await say(page, "ask");
  const question = page.locator(".question form");
  await question.waitFor({ timeout: WAIT });
  await page.waitForFunction(() => document.title === "(1) Tether", null, { timeout: WAIT });
  await watcher.waitForFunction(() => window.__notified.some((t) => t.endsWith("needs you")), null, { timeout: WAIT });
  await page.locator("[data-session] .badge", { hasText: "needs input" }).first().waitFor({ timeout: WAIT });
  await shot(page, "question");
  await question.getByLabel("Environment").selectOption("prod");
  await question.locator("#q-replicas").fill("3");
  await question.getByRole("button", { name: "Answer" }).click();
  await lastAnswer(page, "answered: accept").waitFor({ timeout: WAIT });
  const answered = await lastAnswer(page, "answered: accept").innerText();
  await page.waitForFunction(() => document.title === "Tether", null, { timeout: WAIT });
  await watcher.waitForFunction(() => window.__notified.some((t) => t.endsWith("turn complete")), null, { timeout: WAIT });
  await watcher.close();
  assert(answered.includes('env="prod"') && answered.includes("replicas=3"), `the agent got: ${answered}`);
  // Answered and ended: the session is idle again (AHP status 1), not in progress or waiting.
  let settled;
  for (let i = 0; i < 100; i++) {
    settled = (await rest("/v1/sessions?limit=10")).body.items.find((s) => s.title === "permission");
    if ((settled.status & 31) === 1) break;
    await new Promise((r) => setTimeout(r, 50));
  }
  assert((settled.status & 31) === 1, `the session is not idle after its question was answered: ${JSON.stringify(settled)}`);
  await page.locator("[data-session] .badge", { hasText: "needs input" }).waitFor({ state: "detached", timeout: WAIT });
  await shot(page, "question-answered");

  // An image pasted into the composer reaches the agent.
  await page.getByRole("textbox", { name: "Message" }).fill("blocks");
  await page.evaluate(() => {
    const png = Uint8Array.from(atob("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="), (c) => c.charCodeAt(0));
    const data = new DataTransfer();
    data.items.add(new File([png], "dot.png", { type: "image/png" }));
    document.querySelector("#message").dispatchEvent(new ClipboardEvent("paste", { clipboardData: data, bubbles: true, cancelable: true }));
  });
  await page.locator("#attachments li", { hasText: "dot.png" }).waitFor({ timeout: WAIT });
  await page.getByRole("button", { name: "Send", exact: true }).click();
  await lastAnswer(page, "image image/png").waitFor({ timeout: WAIT });
  await shot(page, "image-pasted");

  // Keyboard only: the message box has the focus after a send; Enter sends.
  // The agent's usage and cost show on the turn and in the details, and the
  // details follow the stream without a reload.
  await page.locator("#message").focus();
  await page.keyboard.type("usage");
  await page.keyboard.press("Enter");
  await lastAnswer(page, "counted").waitFor({ timeout: WAIT });
  await page.locator("#turns li").last().locator(".meta", { hasText: "0.0420 USD" }).waitFor({ timeout: WAIT });
  await page.locator("#projection dd", { hasText: "0.0420 USD" }).waitFor({ timeout: WAIT });
  const turnsShown = () => [...document.querySelectorAll("#projection dt")].find((dt) => dt.textContent === "Turns")?.nextElementSibling?.textContent;
  const turnsDrawn = String(await page.locator("#turns > li").count());
  await page.waitForFunction((n) => [...document.querySelectorAll("#projection dt")].find((dt) => dt.textContent === "Turns")?.nextElementSibling?.textContent === n, turnsDrawn, { timeout: WAIT })
    .catch(async () => fail(`the details say ${await page.evaluate(turnsShown)} turns, the conversation shows ${turnsDrawn}`));

  // The agent's plan shows as a checklist in its turn.
  await say(page, "plan");
  await page.locator('.plan li[data-status="completed"]', { hasText: "look" }).waitFor({ timeout: WAIT });
  await page.locator('.plan li[data-status="pending"]', { hasText: "fix" }).waitFor({ timeout: WAIT });
  await shot(page, "plan");

  // The session exports as Markdown, downloaded from the page.
  const [download] = await Promise.all([page.waitForEvent("download", { timeout: WAIT }), page.getByRole("button", { name: "Markdown" }).click()]);
  const exported = readFileSync(await download.path(), "utf8");
  assert(exported.includes("## You") && exported.includes("answered: accept"), `the export: ${exported.slice(0, 300)}`);

  // What was said is found from the search box: the hit names its session
  // and marks the word; opening it shows the turn where it was said.
  await page.getByRole("searchbox", { name: "Search" }).fill("browser");
  const hit = page.locator("#hits button", { hasText: "From REST" }).first();
  await hit.waitFor({ timeout: WAIT });
  assert((await hit.locator("mark", { hasText: "browser" }).count()) === 1, `the hit marks the word: ${await hit.innerHTML()}`);
  await shot(page, "search");
  await hit.click();
  await page.getByRole("heading", { name: "From REST" }).waitFor({ timeout: WAIT });
  await page.locator("#turns li.found-turn", { hasText: "hello from the browser" }).waitFor({ timeout: WAIT });
  await page.getByRole("searchbox", { name: "Search" }).fill("zzzz-never-said");
  await page.locator("#hits li.empty", { hasText: "Nothing said matches." }).waitFor({ timeout: WAIT });
  await page.getByRole("searchbox", { name: "Search" }).fill("");
  await page.locator("#found").waitFor({ state: "hidden", timeout: WAIT });

  // Dark mode, from the system's preference, is as readable.
  await page.emulateMedia({ colorScheme: "dark" });
  await accessibility(page, "the session view in dark mode");
  await page.screenshot({ path: join(OUT, "session-dark.png") });
  await page.emulateMedia({ colorScheme: "light" });

  // Accessibility, and the main views at a desktop's and a phone's width.
  await accessibility(page, "the session view");
  await page.setViewportSize({ width: 1280, height: 900 });
  await page.evaluate(() => window.scrollTo(0, 0));
  await page.screenshot({ path: join(OUT, "session-1280.png") });
  await page.setViewportSize({ width: 390, height: 844 });
  await page.screenshot({ path: join(OUT, "session-390.png"), fullPage: true });
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - document.documentElement.clientWidth);
  assert(overflow <= 1, `at 390 px the page scrolls sideways by ${overflow} px`);
  // On a phone the open session takes the screen; "← Sessions" brings the list back.
  assert(!(await page.locator("#sessions").isVisible()), "at 390 px the list hides the session");
  await page.getByRole("button", { name: "Back to the sessions" }).click();
  await page.locator('[data-session]').first().waitFor({ timeout: WAIT });
  assert(!(await page.locator("#session").isVisible()), "at 390 px the list and the session share the screen");
  await page.screenshot({ path: join(OUT, "sessions-390.png"), fullPage: true });
  await page.locator('[data-session]', { hasText: "permission" }).click();
  await page.getByRole("textbox", { name: "Message" }).waitFor({ timeout: WAIT });
  await page.setViewportSize({ width: 1280, height: 900 });
  // A long conversation opens on its newest turns; older ones load on request.
  await rest("/v1/sessions", { method: "POST", body: JSON.stringify({ id: "long", title: "Long talk", workingDirectories: [dir] }) });
  for (let i = 0; i < 55; i++) {
    const sent = await rest("/v1/sessions/long/actions", { method: "POST", body: JSON.stringify({ clientId: "e2e-long", clientSeq: i + 1, channel: "ahp-chat:/long.main",
      action: { type: "chat/turnStarted", turnId: `long-${i}`, startedAt: new Date().toISOString(), message: { text: `turn ${i}`, origin: { kind: "user" } } } }) });
    assert(sent.status === 200, `turn ${i}: ${sent.status} ${JSON.stringify(sent.body)}`);
    for (let j = 0; j < 200 && (await rest("/v1/sessions/long")).body.projection.openTurnId; j++) await new Promise((r) => setTimeout(r, 20));
  }
  await page.locator('[data-session="long"]').click();
  await page.getByRole("heading", { name: "Long talk" }).waitFor({ timeout: WAIT });
  await page.locator("#turns > li", { hasText: "turn 54" }).first().waitFor({ timeout: WAIT });
  const window = await page.locator("#turns > li").count();
  assert(window < 55, `the whole long conversation was sent at once (${window} turns)`);
  await page.getByRole("button", { name: "Load older turns" }).click();
  await page.locator("#turns > li", { hasText: "turn 0" }).first().waitFor({ timeout: WAIT });
  assert((await page.locator("#turns > li").count()) === 55, "every turn after loading the older ones");
  await page.getByRole("button", { name: "Load older turns" }).waitFor({ state: "hidden", timeout: WAIT });
  await shot(page, "older-turns");

  writeFileSync(join(OUT, "summary.json"), JSON.stringify({ stored, shown }, null, 2));
  await browser.close();
  browser = null;
  await stop("SIGTERM");

  // With authentication on: a wrong token is told so; a viewer is not
  // offered what it may not do.
  const secret = join(work, "secret");
  writeFileSync(secret, "a console test secret that is long enough, 256 bits+");
  const mint = (role) =>
    new Promise((done) => {
      const child = spawn(BIN, ["token", "--sub", `${role}-e2e`, "--role", role, "--project", "*", "--ttl", "1h", "--auth-secret-file", secret]);
      let out = "";
      child.stdout.on("data", (c) => (out += c));
      child.on("exit", () => done(out.trim()));
    });
  const viewer = await mint("viewer");
  const shortViewer = await new Promise((done) => {
    const child = spawn(BIN, ["token", "--sub", "viewer-e2e", "--role", "viewer", "--project", "*", "--ttl", "6s", "--auth-secret-file", secret]);
    let out = "";
    child.stdout.on("data", (c) => (out += c));
    child.on("exit", () => done(out.trim()));
  });
  const operator = await mint("admin");
  await start(["--auth-secret-file", secret]);
  browser = watched(await chromium.launch({ executablePath: CHROMIUM, args: ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"] }));
  const guest = await (await browser.newContext()).newPage();
  await guest.goto(base);
  const dialog = guest.getByRole("dialog");
  await dialog.waitFor({ timeout: WAIT });
  await guest.getByLabel("Token").fill("not-a-token");
  await guest.getByRole("button", { name: "Use this token" }).click();
  await guest.getByText("The server refused the token").waitFor({ timeout: WAIT });
  await shot(guest, "wrong-token");
  // A token that expires in a few seconds: the page asks for a new one
  // when it does, and keeps its view.
  await guest.getByLabel("Token").fill(shortViewer);
  await guest.getByRole("button", { name: "Use this token" }).click();
  await connected(guest);
  await guest.locator('[data-session="e2e"]').click();
  await guest.getByRole("heading", { name: "From REST" }).waitFor({ timeout: WAIT });

  // An operator in another browser sends a turn; the viewer sees it live,
  // and sees the operator there.
  const admin = await (await browser.newContext()).newPage();
  await admin.goto(base);
  await admin.getByRole("dialog").waitFor({ timeout: WAIT });
  await admin.getByLabel("Token").fill(operator);
  await admin.getByRole("button", { name: "Use this token" }).click();
  await connected(admin);
  await admin.locator('[data-session="e2e"]').click();
  await admin.getByRole("heading", { name: "From REST" }).waitFor({ timeout: WAIT });
  await guest.locator("#presence", { hasText: "admin-e2e" }).waitFor({ timeout: WAIT });
  await say(admin, "seen live by a viewer");
  await lastAnswer(guest, "seen live by a viewer").waitFor({ timeout: WAIT });
  await accessibility(guest, "the viewer's session view");

  await guest.getByText("Your token has expired").waitFor({ timeout: WAIT });
  await shot(guest, "token-expired");
  await guest.getByLabel("Token").fill(viewer);
  await guest.getByRole("button", { name: "Use this token" }).click();
  await connected(guest);
  await guest.getByRole("heading", { name: "From REST" }).waitFor({ timeout: WAIT });
  await say(admin, "after the new token");
  await lastAnswer(guest, "after the new token").waitFor({ timeout: WAIT });
  // A viewer sees the conversation; every control that writes is disabled, with the reason.
  await guest.locator('#turns li[data-state="complete"] .answer', { hasText: "hello from the browser" }).waitFor({ timeout: WAIT });
  assert(await guest.getByRole("button", { name: "Send", exact: true }).isDisabled(), "a viewer can press Send");
  assert(await guest.getByRole("textbox", { name: "Message" }).isDisabled(), "a viewer can type a turn");
  assert(await guest.getByRole("button", { name: "Create session" }).isDisabled(), "a viewer can create a session");
  assert((await guest.getByRole("button", { name: "Send", exact: true }).getAttribute("title")).includes("viewer"), "no reason is given");
  await guest.getByText("Viewer: you can read every session").waitFor({ timeout: WAIT });
  await shot(guest, "viewer");
  await browser.close();
  await stop("SIGTERM");
  console.log(`console e2e: ok (${step} screenshots in ${OUT})`);
  process.exit(0);
} catch (error) {
  // What the pages showed when it failed.
  for (const [i, context] of (browser?.contexts() ?? []).entries()) {
    for (const [j, open] of context.pages().entries()) {
      await open.screenshot({ path: join(OUT, `failed-${i}-${j}.png`), fullPage: true }).catch(() => {});
    }
  }
  if (seen.length) console.error(`what the pages said and failed to load:\n${seen.slice(-60).join("\n")}`);
  console.error(`the server's log, its end:\n${serverLog.slice(-6_000)}`);
  fail(error.stack ?? String(error));
}
