// Starts the real `tether` binary for the SDK's tests: a fresh SQLite file,
// or a fresh Postgres database when TETHER_TEST_POSTGRES_URL is set and the
// test asks for it; optionally with authentication on.

import { execFileSync, spawn } from "node:child_process";
import { mkdtempSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { randomBytes } from "node:crypto";

export const BIN = resolve(process.env.TETHER_BIN ?? "../../target/debug/tether");

async function freePort() {
  return new Promise((done) => {
    const probe = createServer().listen(0, "127.0.0.1", () => {
      const { port } = probe.address();
      probe.close(() => done(port));
    });
  });
}

/** The backends to run each test on: SQLite always, Postgres when configured. */
export function backends() {
  const list = ["sqlite"];
  if (process.env.TETHER_TEST_POSTGRES_URL) list.push("postgres");
  else if (process.env.TETHER_TEST_REQUIRE_POSTGRES) throw new Error("TETHER_TEST_POSTGRES_URL is required");
  return list;
}

function postgresDatabase() {
  const url = new URL(process.env.TETHER_TEST_POSTGRES_URL);
  const name = `tether_sdk_${randomBytes(6).toString("hex")}`;
  const admin = url.toString();
  execFileSync("psql", [admin, "-q", "-c", `CREATE DATABASE ${name}`], {
    env: { ...process.env, PGOPTIONS: "--client-min-messages=warning" },
  });
  url.pathname = `/${name}`;
  return {
    url: url.toString(),
    drop: () => {
      try {
        execFileSync("psql", [admin, "-q", "-c", `DROP DATABASE IF EXISTS ${name} WITH (FORCE)`], {
          env: { ...process.env, PGOPTIONS: "--client-min-messages=warning" },
        });
      } catch {}
    },
  };
}

/** A running server: `base` URL, `mint(options)` for tokens when auth is on, `stop()`. */
export async function startServer({ backend = "sqlite", auth = false } = {}) {
  const work = mkdtempSync(join(tmpdir(), "tether-sdk-"));
  const port = await freePort();
  const db = backend === "postgres" ? postgresDatabase() : { url: `sqlite:${join(work, "tether.db")}`, drop() {} };
  const args = ["serve", "--bind", `127.0.0.1:${port}`, "--database-url", db.url];
  const secret = join(work, "secret");
  if (auth) {
    writeFileSync(secret, randomBytes(48).toString("base64"));
    args.push("--auth-secret-file", secret);
  }
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("TETHER_")));
  const child = spawn(BIN, args, { env, stdio: ["ignore", "ignore", "pipe"] });
  let log = "";
  child.stderr.on("data", (chunk) => (log += chunk));
  const base = `http://127.0.0.1:${port}`;
  let up = false;
  for (let i = 0; i < 400 && !up; i++) {
    try {
      up = (await fetch(`${base}/readyz`)).ok;
    } catch {}
    if (!up) await new Promise((r) => setTimeout(r, 50));
  }
  if (!up) {
    child.kill("SIGKILL");
    db.drop();
    throw new Error(`the server did not start:\n${log}`);
  }
  return {
    base,
    log: () => log,
    /** A token from `tether token`, as an operator mints one. */
    mint({ sub = "sdk-test", role = "admin", project = "*", ttl = "1h" } = {}) {
      return execFileSync(BIN, ["token", "--sub", sub, "--role", role, "--project", project, "--ttl", ttl, "--auth-secret-file", secret], {
        env,
        encoding: "utf8",
      }).trim();
    },
    async stop() {
      const exited = new Promise((done) => child.once("exit", done));
      child.kill("SIGTERM");
      await exited;
      db.drop();
    },
  };
}

/** Resolves when `predicate()` holds, polling; rejects after `ms`. */
export async function until(predicate, ms = 15_000, what = "a condition") {
  const deadline = Date.now() + ms;
  while (!(await predicate())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}
