// A small AHP 1.0 client over a browser WebSocket: JSON-RPC requests and
// notifications, `dispatchAction`, and an honest reconnect that resumes the
// stream with `reconnect` from the last `serverSeq` it saw (a replay with no
// gap and no duplicate, or snapshots when the gap is too large).

export const PROTOCOL_VERSION = "1.0.0";

/** An action envelope as the host sends it. */
export interface Envelope {
  channel: string;
  serverSeq: number;
  action: Action;
  origin?: { clientId: string; clientSeq: number };
  rejectionReason?: string;
}

/** An AHP action: a `type` and its fields. */
export interface Action {
  type: string;
  [field: string]: unknown;
}

/** A channel's state with the seq it includes. */
export interface Snapshot {
  resource: string;
  state: Record<string, unknown>;
  fromSeq: number;
}

export type ConnectionState =
  | { kind: "connecting" }
  | { kind: "connected" }
  | { kind: "reconnecting"; inMs: number; reason: string }
  | { kind: "offline"; reason: string }
  | { kind: "unauthorized" };

export interface Handlers {
  state(state: ConnectionState): void;
  envelope(envelope: Envelope): void;
  /** Snapshots after a gap too large to replay; the caller re-renders. */
  snapshots(snapshots: Snapshot[], reason: string): void;
  notification(method: string, params: Record<string, unknown>): void;
}

interface Pending {
  resolve(value: unknown): void;
  reject(error: Error): void;
}

/** A JSON-RPC error from the host, with its code. */
export class RpcError extends Error {
  constructor(
    message: string,
    readonly code: number,
  ) {
    super(message);
  }
}

const MAX_BACKOFF_MS = 10_000;

export class AhpConnection {
  private socket: WebSocket | null = null;
  private nextId = 1;
  private pending = new Map<number, Pending>();
  /** The highest `serverSeq` each subscribed channel has been brought to. */
  private marks = new Map<string, number>();
  private initialized = false;
  private backoff = 500;
  private closedByUs = false;
  private clientSeq = 0;
  readonly subscriptions = new Set<string>();
  readonly clientId: string;
  private ready: Promise<void>;
  private markReady: () => void = () => {};

  constructor(
    private readonly url: string,
    private readonly token: string | null,
    private readonly handlers: Handlers,
  ) {
    this.clientId = `console-${crypto.randomUUID()}`;
    this.ready = new Promise((resolve) => (this.markReady = resolve));
  }

  /** The highest `serverSeq` this connection has seen. */
  get seen(): number {
    return Math.max(0, ...this.marks.values());
  }

  /** Where a resume starts: the lowest mark, so no channel has a gap (what
   * another channel already has is dropped as a duplicate). */
  private resumeFrom(): number {
    const marks = [...this.subscriptions].map((c) => this.marks.get(c) ?? 0);
    return marks.length ? Math.min(...marks) : 0;
  }

  start(): void {
    this.closedByUs = false;
    this.open();
  }

  stop(): void {
    this.closedByUs = true;
    this.socket?.close(1000, "closed by the page");
  }

  /** Resolves once the connection is initialized (again). */
  whenReady(): Promise<void> {
    return this.ready;
  }

  async subscribe(channel: string): Promise<Snapshot> {
    await this.whenReady();
    const result = (await this.request("subscribe", { channel })) as { snapshot: Snapshot };
    this.subscriptions.add(channel);
    this.marks.set(channel, result.snapshot.fromSeq);
    return result.snapshot;
  }

  async unsubscribe(channel: string): Promise<void> {
    this.subscriptions.delete(channel);
    this.marks.delete(channel);
    if (this.socket?.readyState === WebSocket.OPEN) {
      this.notify("unsubscribe", { channel });
    }
  }

  /** Sends an action; the host's echo (or a rejection) arrives as an envelope. */
  async dispatch(channel: string, action: Action): Promise<number> {
    await this.whenReady();
    this.clientSeq += 1;
    this.notify("dispatchAction", { channel, clientSeq: this.clientSeq, action });
    return this.clientSeq;
  }

  request(method: string, params: Record<string, unknown>): Promise<unknown> {
    const socket = this.socket;
    if (!socket || socket.readyState !== WebSocket.OPEN) {
      return Promise.reject(new Error("not connected"));
    }
    const id = this.nextId++;
    socket.send(JSON.stringify({ jsonrpc: "2.0", id, method, params }));
    return new Promise((resolve, reject) => this.pending.set(id, { resolve, reject }));
  }

  private notify(method: string, params: Record<string, unknown>): void {
    this.socket?.send(JSON.stringify({ jsonrpc: "2.0", method, params }));
  }

  private open(): void {
    this.handlers.state({ kind: "connecting" });
    // Browsers cannot set headers on a WebSocket: the token travels as a
    // subprotocol next to the real one, never in the URL.
    const protocols = this.token ? ["ahp", `bearer.${this.token}`] : ["ahp"];
    const socket = new WebSocket(this.url, protocols);
    this.socket = socket;
    let opened = false;
    socket.onopen = () => {
      opened = true;
      void this.greet();
    };
    socket.onmessage = (event) => this.receive(String(event.data));
    socket.onclose = (event) => {
      for (const pending of this.pending.values()) {
        pending.reject(new Error("connection closed"));
      }
      this.pending.clear();
      this.ready = new Promise((resolve) => (this.markReady = resolve));
      if (this.closedByUs) {
        this.handlers.state({ kind: "offline", reason: "closed" });
        return;
      }
      if (!opened && this.token !== null && event.code === 1006) {
        // A refused upgrade: the page checks the token over REST.
        this.handlers.state({ kind: "unauthorized" });
      }
      const reason = event.reason || (opened ? "the connection dropped" : "the server cannot be reached");
      const inMs = this.backoff;
      this.backoff = Math.min(this.backoff * 2, MAX_BACKOFF_MS);
      this.handlers.state({ kind: "reconnecting", inMs, reason });
      setTimeout(() => {
        if (!this.closedByUs) {
          this.open();
        }
      }, inMs);
    };
  }

  private async greet(): Promise<void> {
    try {
      if (!this.initialized) {
        await this.request("initialize", {
          protocolVersions: [PROTOCOL_VERSION],
          clientId: this.clientId,
        });
        this.initialized = true;
      } else {
        const result = (await this.request("reconnect", {
          clientId: this.clientId,
          lastSeenServerSeq: this.resumeFrom(),
          subscriptions: [...this.subscriptions],
        })) as { type: string; actions?: Envelope[]; snapshots?: Snapshot[] };
        if (result.type === "snapshot") {
          const snapshots = result.snapshots ?? [];
          for (const snapshot of snapshots) {
            this.marks.set(snapshot.resource, snapshot.fromSeq);
          }
          this.handlers.snapshots(snapshots, "the gap was too large to replay");
        } else {
          for (const envelope of result.actions ?? []) {
            this.deliver(envelope);
          }
        }
      }
      this.backoff = 500;
      this.handlers.state({ kind: "connected" });
      this.markReady();
    } catch (error) {
      this.socket?.close(4000, `could not resume: ${(error as Error).message}`);
    }
  }

  private receive(text: string): void {
    let message: { id?: number; method?: string; params?: unknown; result?: unknown; error?: { message: string; code: number } };
    try {
      message = JSON.parse(text);
    } catch {
      return;
    }
    if (message.id !== undefined && (message.result !== undefined || message.error !== undefined)) {
      const pending = this.pending.get(message.id);
      this.pending.delete(message.id);
      if (message.error) {
        pending?.reject(new RpcError(message.error.message, message.error.code));
      } else {
        pending?.resolve(message.result);
      }
      return;
    }
    if (message.method === "action") {
      this.deliver(message.params as Envelope);
    } else if (message.method) {
      this.handlers.notification(message.method, (message.params ?? {}) as Record<string, unknown>);
    }
  }

  private deliver(envelope: Envelope): void {
    // Nothing at or below a channel's mark is shown twice.
    const mark = this.marks.get(envelope.channel) ?? 0;
    if (envelope.serverSeq <= mark) {
      return;
    }
    this.marks.set(envelope.channel, envelope.serverSeq);
    this.handlers.envelope(envelope);
  }
}
