// The AHP 1.0 client over WebSocket, for browsers and Node.js.
//
// - One connection at a time; when it drops, it reconnects with
//   exponential backoff and jitter and resumes with AHP `reconnect` from the
//   last `serverSeq` it delivered on each channel: the server replays what
//   was missed (no gap), and what was already delivered is never delivered
//   again (no duplicate). When the gap is too large to replay the server
//   sends snapshots instead, and the client says so (`resynced`).
// - Durable origins: each dispatch is numbered from this client's identity
//   (`clientId` and a `clientSeq` that is never reused) and is sent again
//   after a reconnect until its echo arrives; the server applies each
//   `(clientId, clientSeq)` once, so a retried action applies once. Give
//   the client an `identity` store to keep that promise across page loads
//   or process restarts.
// - Tokens come from a provider and are refreshed shortly before they
//   expire, by reconnecting with a fresh one (and replaying), so the
//   server never has to close the stream for an expired token.
// - Bounded: at most `maxPendingDispatches` dispatches wait for their
//   echo; one more is refused at once (`QueueFullError`).

import type { ActionEnvelope, Snapshot, StateAction } from "./ahp-types.js";
import { resolveToken, type Token, type TokenProvider } from "./tokens.js";

export const PROTOCOL_VERSION = "1.0.0";
/** The `_meta` key with which a client asks Tether for durable origins. */
export const DURABLE_ORIGINS = "tether/durableOrigins";
/** Close code with which the server ends a connection whose token expired. */
export const CLOSE_TOKEN_EXPIRED = 4003;

/** An action of the protocol, or one of Tether's `x-tether/*` extensions. */
export type Action = StateAction | { type: `x-${string}`; [field: string]: unknown };

/** An envelope as the client delivers it, with its action typed. */
export type Envelope = Omit<ActionEnvelope, "action"> & { action: Action };

/** The outcome of a dispatch: committed (the envelope as recorded), or refused with the server's reason. */
export type Dispatched =
  | { accepted: true; envelope: Envelope }
  | { accepted: false; clientSeq: number; reason: string };

export type ConnectionState =
  | { kind: "connecting"; attempt: number }
  | { kind: "connected" }
  | { kind: "reconnecting"; inMs: number; reason: string }
  | { kind: "unauthorized"; reason: string }
  | { kind: "closed" };

export interface ClientEvents {
  /** An envelope of a subscribed channel, in order, once. */
  envelope: (envelope: Envelope) => void;
  /** A channel's state: after `subscribe`, or after a resync. */
  snapshot: (snapshot: Snapshot) => void;
  /** The connection came back and replayed `replayed` envelopes. */
  resumed: (replayed: number) => void;
  /** The gap was too large to replay: snapshots follow; rebuild from them. */
  resynced: () => void;
  /** Channels that no longer exist (deleted while disconnected). */
  gone: (channels: string[]) => void;
  state: (state: ConnectionState) => void;
  /** Any other notification from the server (method and params). */
  notification: (method: string, params: unknown) => void;
}

/** Where a client keeps who it is, so its numbers are never reused. */
export interface IdentityStore {
  load(): { clientId: string; lastSeq: number } | undefined;
  save(identity: { clientId: string; lastSeq: number }): void;
}

/**
 * An identity kept in a `Storage` under `key`. Two live clients must never
 * share one (they would hand out the same numbers): in a browser use
 * `sessionStorage` (one per tab, kept across reloads), not `localStorage`
 * (shared by every tab of the origin).
 */
export function storageIdentity(storage: Pick<Storage, "getItem" | "setItem">, key = "tether-identity"): IdentityStore {
  return {
    load() {
      const raw = storage.getItem(key);
      return raw ? (JSON.parse(raw) as { clientId: string; lastSeq: number }) : undefined;
    },
    save(identity) {
      storage.setItem(key, JSON.stringify(identity));
    },
  };
}

/** The subset of the WebSocket API the client uses (browsers' and the `ws` package's). */
export interface WebSocketLike {
  readonly readyState: number;
  readonly protocol: string;
  onopen: ((event: unknown) => void) | null;
  onmessage: ((event: { data: unknown }) => void) | null;
  onclose: ((event: { code: number; reason: string }) => void) | null;
  onerror: ((event: unknown) => void) | null;
  send(data: string): void;
  close(code?: number, reason?: string): void;
}
export type WebSocketConstructor = new (url: string, protocols?: string[]) => WebSocketLike;

export interface AhpClientOptions {
  /** The server: an `http(s)://` base URL (the client uses `/ahp` on it) or a `ws(s)://` URL used as given. */
  url: string;
  token?: TokenProvider;
  /** Keeps `clientId` and the last `clientSeq`; default: a fresh id, in memory. */
  identity?: IdentityStore;
  /** The WebSocket class: the global one by default (pass `ws`'s in Node.js 20). */
  WebSocket?: WebSocketConstructor;
  /** Dispatches waiting for their echo, at most (default 1,024). */
  maxPendingDispatches?: number;
  /** How long a request may wait for its answer (default 30 s). */
  requestTimeoutMs?: number;
  /** Reconnect backoff: first delay and cap (default 250 ms and 10 s). */
  backoff?: { initialMs: number; maxMs: number };
  /** Reconnect with a fresh token this long before the current one expires (default: a tenth of its life, 1 s to 60 s). */
  refreshBeforeMs?: number;
}

/** A JSON-RPC error from the server, with its code and data. */
export class RpcError extends Error {
  constructor(
    message: string,
    readonly code: number,
    readonly data?: unknown,
  ) {
    super(message);
    this.name = "RpcError";
  }
}

/** Too many dispatches are waiting for their echo. */
export class QueueFullError extends Error {
  constructor(limit: number) {
    super(`${limit} dispatches are already waiting for their echo; wait for some before sending more`);
    this.name = "QueueFullError";
  }
}

interface PendingRequest {
  resolve(value: unknown): void;
  reject(error: Error): void;
  timer: ReturnType<typeof setTimeout>;
}

interface PendingDispatch {
  channel: string;
  clientSeq: number;
  action: Action;
  resolve(outcome: Dispatched): void;
  reject(error: Error): void;
}

type Listeners = { [K in keyof ClientEvents]: Set<ClientEvents[K]> };

const OPEN = 1;
/** The longest delay `setTimeout` keeps. */
const MAX_TIMER = 2 ** 31 - 1;
/** Tether's JSON-RPC code for a request over its principal's rate (`data.retryAfterMs`). */
const TOO_MANY_REQUESTS = -32050;

export class AhpClient {
  readonly clientId: string;
  private lastSeq: number;
  private readonly options: Required<Omit<AhpClientOptions, "token" | "identity" | "refreshBeforeMs">> &
    Pick<AhpClientOptions, "token" | "identity" | "refreshBeforeMs">;
  private socket: WebSocketLike | null = null;
  private nextId = 1;
  private readonly requests = new Map<number, PendingRequest>();
  private readonly dispatches = new Map<number, PendingDispatch>();
  /** Each subscribed channel and the highest `serverSeq` delivered on it. */
  private readonly marks = new Map<string, number>();
  /** Channels asked for and not given up (a subscribe still in flight included). */
  private readonly wanted = new Set<string>();
  /** The highest `serverSeq` delivered on any channel. */
  private highest = 0;
  private readonly listeners: Listeners = {
    envelope: new Set(),
    snapshot: new Set(),
    resumed: new Set(),
    resynced: new Set(),
    gone: new Set(),
    state: new Set(),
    notification: new Set(),
  };
  private attempt = 0;
  private stopped = true;
  private ready: Promise<void>;
  private markReady: () => void = () => {};
  private failReady: (error: Error) => void = () => {};
  private refreshTimer: ReturnType<typeof setTimeout> | undefined;
  private retryTimer: ReturnType<typeof setTimeout> | undefined;
  private currentState: ConnectionState = { kind: "closed" };
  /** The token a refresh replaced (a provider that answers it again is not asked again until it expires). */
  private refreshedFrom: string | undefined;
  /** The token of a connection the server closed as expired (4003). */
  private expiredToken: string | undefined;

  constructor(options: AhpClientOptions) {
    const WebSocketClass = options.WebSocket ?? (globalThis as { WebSocket?: WebSocketConstructor }).WebSocket;
    if (!WebSocketClass) {
      throw new Error("no WebSocket class: pass `WebSocket` (e.g. from the `ws` package) in Node.js 20");
    }
    this.options = {
      maxPendingDispatches: 1024,
      requestTimeoutMs: 30_000,
      backoff: { initialMs: 250, maxMs: 10_000 },
      ...options,
      url: wsUrl(options.url),
      WebSocket: WebSocketClass,
    };
    const stored = options.identity?.load();
    this.clientId = stored?.clientId ?? `sdk-${randomId()}`;
    this.lastSeq = stored?.lastSeq ?? 0;
    options.identity?.save({ clientId: this.clientId, lastSeq: this.lastSeq });
    this.ready = this.newReady();
  }

  /** Listens to an event; answers a function that stops listening. */
  on<K extends keyof ClientEvents>(event: K, listener: ClientEvents[K]): () => void {
    this.listeners[event].add(listener);
    return () => this.listeners[event].delete(listener);
  }

  /** The connection's state now. */
  get state(): ConnectionState {
    return this.currentState;
  }

  /** Connects; resolves once the first connection is ready (and keeps reconnecting after). */
  connect(): Promise<void> {
    if (this.stopped) {
      this.stopped = false;
      void this.open();
    }
    return this.whenReady();
  }

  /** Closes for good: pending requests and dispatches fail. */
  close(): void {
    this.stopped = true;
    this.wanted.clear();
    clearTimeout(this.refreshTimer);
    clearTimeout(this.retryTimer);
    this.socket?.close(1000, "closed by the client");
    this.socket = null;
    const closed = new Error("the client was closed");
    for (const dispatch of this.dispatches.values()) dispatch.reject(closed);
    this.dispatches.clear();
    this.failRequests(closed);
    this.failReady(closed);
    this.setState({ kind: "closed" });
  }

  /** Resolves when the current (or next) connection is ready. */
  whenReady(): Promise<void> {
    return this.ready;
  }

  /** The highest `serverSeq` delivered on `channel`, if subscribed. */
  seen(channel: string): number | undefined {
    return this.marks.get(channel);
  }

  /** Subscribes to a channel; answers its snapshot (also given to `snapshot` listeners). */
  async subscribe(channel: string): Promise<Snapshot> {
    await this.whenReady();
    this.wanted.add(channel);
    // Everything delivered before the request was committed before the
    // snapshot is taken; none of it was on this channel after `fromSeq`,
    // so the channel's mark can start there (a quiet channel's own last
    // seq may be far behind, and would drag every resume back).
    const before = this.highest;
    const result = (await this.request("subscribe", { channel })) as { snapshot: Snapshot };
    if (!this.wanted.has(channel)) {
      // Given up while the answer was on its way.
      if (this.socket?.readyState === OPEN) this.notify("unsubscribe", { channel });
      return result.snapshot;
    }
    this.marks.set(channel, Math.max(result.snapshot.fromSeq, before));
    this.emit("snapshot", result.snapshot);
    return result.snapshot;
  }

  /** Stops following a channel. */
  unsubscribe(channel: string): void {
    this.wanted.delete(channel);
    this.marks.delete(channel);
    if (this.socket?.readyState === OPEN) this.notify("unsubscribe", { channel });
  }

  /**
   * Dispatches an action on a channel and resolves with its outcome once the
   * server has committed it (or refused it). While disconnected it waits for
   * the reconnect and is sent again with the same `clientSeq`: the server
   * applies it once.
   */
  dispatch(channel: string, action: Action): Promise<Dispatched> {
    if (this.dispatches.size >= this.options.maxPendingDispatches) {
      return Promise.reject(new QueueFullError(this.options.maxPendingDispatches));
    }
    const clientSeq = this.takeSeq();
    return new Promise<Dispatched>((resolve, reject) => {
      const pending: PendingDispatch = { channel, clientSeq, action, resolve, reject };
      this.dispatches.set(clientSeq, pending);
      if (this.currentState.kind === "connected") this.send(pending);
    });
  }

  /** The number of dispatches waiting for their echo. */
  get pendingDispatches(): number {
    return this.dispatches.size;
  }

  /** A JSON-RPC request on the current connection (e.g. `createSession`, `resolveSessionConfig`). */
  request(method: string, params: Record<string, unknown>): Promise<unknown> {
    const socket = this.socket;
    if (!socket || socket.readyState !== OPEN) return Promise.reject(new Error("not connected"));
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.requests.delete(id);
        reject(new Error(`${method}: no answer within ${this.options.requestTimeoutMs} ms`));
      }, this.options.requestTimeoutMs);
      this.requests.set(id, { resolve, reject, timer });
      socket.send(JSON.stringify({ jsonrpc: "2.0", id, method, params }));
    });
  }

  /** Drops the connection as a network failure would (it resumes after the backoff). */
  drop(reason = "dropped by the client"): void {
    this.socket?.close(4000, reason);
  }

  /** Connects again now: a live connection is replaced (and resumes), a pending retry does not wait. */
  reconnect(): void {
    if (this.stopped) return;
    if (this.socket) {
      this.socket.close(4000, "token refresh");
      return;
    }
    clearTimeout(this.retryTimer);
    void this.open();
  }

  private takeSeq(): number {
    this.lastSeq += 1;
    this.options.identity?.save({ clientId: this.clientId, lastSeq: this.lastSeq });
    return this.lastSeq;
  }

  private newReady(): Promise<void> {
    const ready = new Promise<void>((resolve, reject) => {
      this.markReady = resolve;
      this.failReady = reject;
    });
    ready.catch(() => {});
    return ready;
  }

  private setState(state: ConnectionState): void {
    this.currentState = state;
    this.emit("state", state);
  }

  private emit<K extends keyof ClientEvents>(event: K, ...args: Parameters<ClientEvents[K]>): void {
    for (const listener of this.listeners[event]) {
      (listener as (...a: Parameters<ClientEvents[K]>) => void)(...args);
    }
  }

  private async open(): Promise<void> {
    if (this.stopped) return;
    this.attempt += 1;
    this.setState({ kind: "connecting", attempt: this.attempt });
    let token: Token | undefined;
    try {
      token = await resolveToken(this.options.token);
    } catch (error) {
      this.retry(`no token: ${(error as Error).message}`, true);
      return;
    }
    if (this.stopped) return;
    // An expired token is not tried again: the provider has to give a new
    // one (the console asks its user; `reconnect()` tries again at once).
    if (token && (token.value === this.expiredToken || (token.expiresAt !== undefined && token.expiresAt <= Date.now()))) {
      this.expiredToken = token.value;
      this.retry("the token has expired; a new one is needed", true);
      return;
    }
    // Browsers cannot set headers on a WebSocket: the token travels as a
    // subprotocol beside the real one, never in the URL.
    const protocols = token ? ["ahp", `bearer.${token.value}`] : ["ahp"];
    const socket = new this.options.WebSocket(this.options.url, protocols);
    this.socket = socket;
    let opened = false;
    socket.onopen = () => {
      opened = true;
      void this.greet(socket, token);
    };
    socket.onmessage = (event) => this.receive(String(event.data));
    socket.onerror = () => {};
    socket.onclose = (event) => {
      if (this.socket !== socket) return;
      this.socket = null;
      clearTimeout(this.refreshTimer);
      this.failRequests(new Error("connection closed"));
      if (this.currentState.kind === "connected") this.ready = this.newReady();
      if (this.stopped) return;
      const refused = !opened && token !== undefined;
      const reason = event.reason || (opened ? "the connection dropped" : "the server cannot be reached");
      // An expired token, or a refresh: straight back, with a fresh token.
      if (event.code === CLOSE_TOKEN_EXPIRED) this.expiredToken = token?.value;
      const immediate = event.code === CLOSE_TOKEN_EXPIRED || event.reason === "token refresh";
      this.retry(refused ? `the server refused the connection (token?): ${reason}` : reason, refused, immediate);
    };
  }

  private retry(reason: string, unauthorized: boolean, immediate = false): void {
    const { initialMs, maxMs } = this.options.backoff;
    const cap = Math.min(maxMs, initialMs * 2 ** Math.min(this.attempt - 1, 16));
    // Equal jitter: half fixed, half random, so clients dropped together do not return together.
    const inMs = immediate ? 0 : Math.round(cap / 2 + Math.random() * (cap / 2));
    this.setState(unauthorized ? { kind: "unauthorized", reason } : { kind: "reconnecting", inMs, reason });
    clearTimeout(this.retryTimer);
    this.retryTimer = setTimeout(() => void this.open(), inMs);
  }

  private async greet(socket: WebSocketLike, token: Token | undefined): Promise<void> {
    try {
      await this.request("initialize", {
        protocolVersions: [PROTOCOL_VERSION],
        clientId: this.clientId,
        _meta: { [DURABLE_ORIGINS]: true },
      });
      if (this.marks.size > 0) await this.resume();
      if (this.socket !== socket) return;
      this.attempt = 0;
      this.setState({ kind: "connected" });
      for (const pending of this.dispatches.values()) this.send(pending);
      this.scheduleRefresh(socket, token);
      this.markReady();
    } catch (error) {
      if (error instanceof RpcError && error.code === -32005) {
        // An unsupported protocol version will not get better by retrying.
        this.close();
        return;
      }
      socket.close(4000, `could not resume: ${(error as Error).message}`.slice(0, 120));
    }
  }

  /** Brings every subscribed channel up to date on a fresh connection. */
  private async resume(): Promise<void> {
    const channels = [...this.marks.keys()];
    const lastSeen = Math.min(...this.marks.values());
    const result = (await this.request("reconnect", {
      clientId: this.clientId,
      lastSeenServerSeq: lastSeen,
      subscriptions: channels,
      _meta: { [DURABLE_ORIGINS]: true },
    })) as { type: "replay"; actions: Envelope[]; missing?: string[] } | { type: "snapshot"; snapshots: Snapshot[] };
    if (result.type === "snapshot") {
      this.emit("resynced");
      const given = new Set(result.snapshots.map((s) => s.resource));
      for (const snapshot of result.snapshots) {
        this.marks.set(snapshot.resource, snapshot.fromSeq);
        this.emit("snapshot", snapshot);
      }
      // A channel the server gave no snapshot for no longer exists (for us).
      const gone = channels.filter((c) => !given.has(c));
      if (gone.length) {
        for (const channel of gone) this.forget(channel);
        this.emit("gone", gone);
      }
      return;
    }
    let replayed = 0;
    let top = lastSeen;
    for (const envelope of result.actions) {
      top = Math.max(top, envelope.serverSeq);
      if (this.accept(envelope)) replayed += 1;
    }
    // The replay covered every subscribed channel up to its last seq: a
    // quiet channel is as current as the busiest.
    for (const channel of this.marks.keys()) this.marks.set(channel, Math.max(this.marks.get(channel)!, top));
    this.emit("resumed", replayed);
    if (result.missing?.length) {
      for (const channel of result.missing) this.forget(channel);
      this.emit("gone", result.missing);
    }
  }

  private forget(channel: string): void {
    this.marks.delete(channel);
    this.wanted.delete(channel);
  }

  /**
   * Reconnects with a fresh token shortly before this one expires. Only a
   * provider function can give a fresh one, and a token too close to its
   * end to be worth replacing (or the same token again) is left to expire.
   */
  private scheduleRefresh(socket: WebSocketLike, token: Token | undefined): void {
    clearTimeout(this.refreshTimer);
    if (!token?.expiresAt || typeof this.options.token !== "function" || token.value === this.refreshedFrom) return;
    const life = token.expiresAt - Date.now();
    const before = this.options.refreshBeforeMs ?? Math.min(60_000, Math.max(1_000, life / 10));
    if (life <= before) return;
    // setTimeout holds at most 2^31-1 ms: a longer-lived token is looked at again then.
    if (life - before > MAX_TIMER) {
      this.refreshTimer = setTimeout(() => this.socket === socket && this.scheduleRefresh(socket, token), MAX_TIMER);
      return;
    }
    const inMs = life - before;
    this.refreshTimer = setTimeout(() => {
      if (this.socket !== socket) return;
      this.refreshedFrom = token.value;
      socket.close(4000, "token refresh");
    }, inMs);
  }

  private send(pending: PendingDispatch): void {
    const socket = this.socket;
    if (!socket || socket.readyState !== OPEN) return;
    // Sent as a request so that a dispatch to a channel that does not
    // exist gets an error instead of AHP's silence.
    const id = this.nextId++;
    const timer = setTimeout(() => this.requests.delete(id), this.options.requestTimeoutMs);
    this.requests.set(id, {
      timer,
      resolve: () => {},
      reject: (error) => {
        if (!(error instanceof RpcError)) return; // the connection dropped: resent on the next one
        if (error.code === TOO_MANY_REQUESTS) {
          // Over the rate: the same number again, when the server says.
          const wait = Number((error.data as { retryAfterMs?: number } | undefined)?.retryAfterMs ?? 1000);
          setTimeout(() => this.dispatches.has(pending.clientSeq) && this.send(pending), wait);
          return;
        }
        if (this.dispatches.delete(pending.clientSeq)) pending.reject(error);
      },
    });
    socket.send(
      JSON.stringify({
        jsonrpc: "2.0",
        id,
        method: "dispatchAction",
        params: { channel: pending.channel, clientSeq: pending.clientSeq, action: pending.action },
      }),
    );
  }

  private notify(method: string, params: Record<string, unknown>): void {
    this.socket?.send(JSON.stringify({ jsonrpc: "2.0", method, params }));
  }

  private failRequests(error: Error): void {
    for (const request of this.requests.values()) {
      clearTimeout(request.timer);
      request.reject(error);
    }
    this.requests.clear();
  }

  private receive(text: string): void {
    let message: {
      id?: number;
      method?: string;
      params?: unknown;
      result?: unknown;
      error?: { message: string; code: number; data?: unknown };
    };
    try {
      message = JSON.parse(text);
    } catch {
      return;
    }
    if (message.id !== undefined && message.method === undefined) {
      const request = this.requests.get(message.id);
      if (!request) return;
      this.requests.delete(message.id);
      clearTimeout(request.timer);
      if (message.error) request.reject(new RpcError(message.error.message, message.error.code, message.error.data));
      else request.resolve(message.result);
      return;
    }
    if (message.method === "action") {
      this.accept(message.params as Envelope);
    } else if (message.method) {
      this.emit("notification", message.method, message.params);
    }
  }

  /** Settles the dispatch an envelope answers and delivers it if it is new; answers whether it was delivered. */
  private accept(envelope: Envelope): boolean {
    const origin = envelope.origin;
    if (origin && origin.clientId === this.clientId) {
      const pending = this.dispatches.get(origin.clientSeq);
      if (pending) {
        this.dispatches.delete(origin.clientSeq);
        pending.resolve(
          envelope.rejectionReason
            ? { accepted: false, clientSeq: origin.clientSeq, reason: envelope.rejectionReason }
            : { accepted: true, envelope },
        );
      }
    }
    if (envelope.rejectionReason) return false;
    const mark = this.marks.get(envelope.channel);
    if (mark === undefined || envelope.serverSeq <= mark) return false;
    this.marks.set(envelope.channel, envelope.serverSeq);
    this.highest = Math.max(this.highest, envelope.serverSeq);
    this.emit("envelope", envelope);
    return true;
  }
}

/** `http(s)://host` → `ws(s)://host/ahp`; a `ws(s)://` URL is used as given. */
export function wsUrl(url: string): string {
  if (/^wss?:\/\//.test(url)) return url;
  const base = url.replace(/\/+$/, "").replace(/^http/, "ws");
  return `${base}/ahp`;
}

function randomId(): string {
  const crypto = (globalThis as { crypto?: { randomUUID?: () => string } }).crypto;
  if (crypto?.randomUUID) return crypto.randomUUID();
  return Math.random().toString(36).slice(2) + Date.now().toString(36);
}
