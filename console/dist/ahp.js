// A small AHP 1.0 client over a browser WebSocket: JSON-RPC requests and
// notifications, `dispatchAction`, and an honest reconnect that resumes the
// stream with `reconnect` from the last `serverSeq` it saw (a replay with no
// gap and no duplicate, or snapshots when the gap is too large).
export const PROTOCOL_VERSION = "1.0.0";
/** A JSON-RPC error from the host, with its code. */
export class RpcError extends Error {
    code;
    constructor(message, code) {
        super(message);
        this.code = code;
    }
}
const MAX_BACKOFF_MS = 10_000;
export class AhpConnection {
    url;
    token;
    handlers;
    socket = null;
    nextId = 1;
    pending = new Map();
    /** The highest `serverSeq` each subscribed channel has been brought to. */
    marks = new Map();
    initialized = false;
    backoff = 500;
    closedByUs = false;
    clientSeq = 0;
    subscriptions = new Set();
    clientId;
    ready;
    markReady = () => { };
    constructor(url, token, handlers) {
        this.url = url;
        this.token = token;
        this.handlers = handlers;
        this.clientId = `console-${crypto.randomUUID()}`;
        this.ready = new Promise((resolve) => (this.markReady = resolve));
    }
    /** The highest `serverSeq` this connection has seen. */
    get seen() {
        return Math.max(0, ...this.marks.values());
    }
    /** Where a resume starts: the lowest mark, so no channel has a gap (what
     * another channel already has is dropped as a duplicate). */
    resumeFrom() {
        const marks = [...this.subscriptions].map((c) => this.marks.get(c) ?? 0);
        return marks.length ? Math.min(...marks) : 0;
    }
    start() {
        this.closedByUs = false;
        this.open();
    }
    stop() {
        this.closedByUs = true;
        this.socket?.close(1000, "closed by the page");
    }
    /** Resolves once the connection is initialized (again). */
    whenReady() {
        return this.ready;
    }
    async subscribe(channel) {
        await this.whenReady();
        const result = (await this.request("subscribe", { channel }));
        this.subscriptions.add(channel);
        this.marks.set(channel, result.snapshot.fromSeq);
        return result.snapshot;
    }
    async unsubscribe(channel) {
        this.subscriptions.delete(channel);
        this.marks.delete(channel);
        if (this.socket?.readyState === WebSocket.OPEN) {
            this.notify("unsubscribe", { channel });
        }
    }
    /** Sends an action; the host's echo (or a rejection) arrives as an envelope. */
    async dispatch(channel, action) {
        await this.whenReady();
        this.clientSeq += 1;
        this.notify("dispatchAction", { channel, clientSeq: this.clientSeq, action });
        return this.clientSeq;
    }
    request(method, params) {
        const socket = this.socket;
        if (!socket || socket.readyState !== WebSocket.OPEN) {
            return Promise.reject(new Error("not connected"));
        }
        const id = this.nextId++;
        socket.send(JSON.stringify({ jsonrpc: "2.0", id, method, params }));
        return new Promise((resolve, reject) => this.pending.set(id, { resolve, reject }));
    }
    notify(method, params) {
        this.socket?.send(JSON.stringify({ jsonrpc: "2.0", method, params }));
    }
    open() {
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
    async greet() {
        try {
            if (!this.initialized) {
                await this.request("initialize", {
                    protocolVersions: [PROTOCOL_VERSION],
                    clientId: this.clientId,
                });
                this.initialized = true;
            }
            else {
                const result = (await this.request("reconnect", {
                    clientId: this.clientId,
                    lastSeenServerSeq: this.resumeFrom(),
                    subscriptions: [...this.subscriptions],
                }));
                if (result.type === "snapshot") {
                    const snapshots = result.snapshots ?? [];
                    for (const snapshot of snapshots) {
                        this.marks.set(snapshot.resource, snapshot.fromSeq);
                    }
                    this.handlers.snapshots(snapshots, "the gap was too large to replay");
                }
                else {
                    for (const envelope of result.actions ?? []) {
                        this.deliver(envelope);
                    }
                }
            }
            this.backoff = 500;
            this.handlers.state({ kind: "connected" });
            this.markReady();
        }
        catch (error) {
            this.socket?.close(4000, `could not resume: ${error.message}`);
        }
    }
    receive(text) {
        let message;
        try {
            message = JSON.parse(text);
        }
        catch {
            return;
        }
        if (message.id !== undefined && (message.result !== undefined || message.error !== undefined)) {
            const pending = this.pending.get(message.id);
            this.pending.delete(message.id);
            if (message.error) {
                pending?.reject(new RpcError(message.error.message, message.error.code));
            }
            else {
                pending?.resolve(message.result);
            }
            return;
        }
        if (message.method === "action") {
            this.deliver(message.params);
        }
        else if (message.method) {
            this.handlers.notification(message.method, (message.params ?? {}));
        }
    }
    deliver(envelope) {
        // Nothing at or below a channel's mark is shown twice.
        const mark = this.marks.get(envelope.channel) ?? 0;
        if (envelope.serverSeq <= mark) {
            return;
        }
        this.marks.set(envelope.channel, envelope.serverSeq);
        this.handlers.envelope(envelope);
    }
}
