// The Tether console: a session list that follows the root channel, and a
// session view that renders the stream of envelopes in order, the
// projection, working directories, turns with their streamed answers, tool
// calls and permission prompts. REST for reads that are not streams, AHP
// over WebSocket for everything live.

import { AhpConnection, Action, ConnectionState, Envelope, Snapshot } from "./ahp.js";

const TOKEN_KEY = "tether-token";
/** Envelopes kept on the page; older ones are in the transcript (REST). */
const MAX_ROWS = 2_000;

const $ = <T extends HTMLElement>(selector: string): T => {
  const found = document.querySelector<T>(selector);
  if (!found) throw new Error(`missing ${selector}`);
  return found;
};

function element<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attributes: Record<string, string> = {},
  ...children: (Node | string)[]
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attributes)) node.setAttribute(key, value);
  node.append(...children);
  return node;
}

interface SessionView {
  id: string;
  resource: string;
  project: string;
  provider: string;
  title?: string;
  state: string;
  cause?: string;
  resumable: boolean;
  turns: number;
  workingDirectories: string[];
  defaultChat?: string;
  lastSeq: number;
  updatedAt: string;
  projection: {
    openTurnId?: string;
    documentRevision: number;
    commands: { name: string; description: string }[];
  };
}

interface ToolView {
  id: string;
  name: string;
  status: string;
  options: { id: string; label: string; kind: string }[];
  result?: string;
}

interface TurnView {
  id: string;
  text: string;
  parts: Map<string, { kind: string; text: string }>;
  tools: Map<string, ToolView>;
  state: string;
  error?: string;
}

/** A path (or a `file:` URI) as a `file:` URI; the server canonicalises it. */
function toUri(path: string): string {
  return path.startsWith("file:") ? path : `file://${path.startsWith("/") ? "" : "/"}${encodeURI(path)}`;
}

/** The caller's role, read from the token (the server checks it). */
function roleOf(token: string | null): string {
  if (!token) return "admin";
  try {
    const payload = JSON.parse(atob(token.split(".")[1].replace(/-/g, "+").replace(/_/g, "/")));
    return String(payload.role ?? "viewer");
  } catch {
    return "viewer";
  }
}

class Console {
  private token = sessionStorage.getItem(TOKEN_KEY);
  private connection: AhpConnection | null = null;
  private current: SessionView | null = null;
  private turns = new Map<string, TurnView>();
  private rows = 0;
  /** Which form a dispatch came from, to show its refusal beside it. */
  private sentFrom = new Map<number, HTMLElement>();
  private listTimer: number | undefined;
  private viewTimer: number | undefined;
  private renderQueued = false;

  /** The forms' listeners are added once, however often `start` runs. */
  constructor() {
    this.bindForms();
  }

  async start(): Promise<void> {
    if (!(await this.checkToken())) return;
    this.connect();
    await Promise.all([this.loadAgents(), this.loadSessions()]);
  }

  // ─── REST ───────────────────────────────────────────────────────────

  private async api(path: string, init: RequestInit = {}): Promise<{ status: number; body: any }> {
    const headers = new Headers(init.headers);
    if (this.token) headers.set("authorization", `Bearer ${this.token}`);
    if (init.body) headers.set("content-type", "application/json");
    const response = await fetch(path, { ...init, headers });
    const text = await response.text();
    let body: any = null;
    try {
      body = text ? JSON.parse(text) : null;
    } catch {
      body = text;
    }
    if (response.status === 401) this.askToken("The server refused the token: it is missing, wrong or expired. Enter a new one.");
    return { status: response.status, body };
  }

  private async checkToken(): Promise<boolean> {
    const { status } = await this.api("/v1/sessions?limit=1");
    return status !== 401;
  }

  private askToken(message: string): void {
    const dialog = $<HTMLDialogElement>("#token");
    $("#token-message").textContent = message;
    if (!dialog.open) dialog.showModal();
  }

  // ─── The connection ─────────────────────────────────────────────────

  private connect(): void {
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    this.connection?.stop();
    // A replaced connection may still report its close: only the current
    // one speaks to the page.
    const current = () => this.connection === connection;
    const connection: AhpConnection = new AhpConnection(`${scheme}//${location.host}/ahp`, this.token, {
      state: (state) => {
        if (current()) this.showState(state);
      },
      envelope: (envelope) => {
        if (current()) this.onEnvelope(envelope);
      },
      snapshots: (snapshots, reason) => {
        if (current()) this.onSnapshots(snapshots, reason);
      },
      notification: (method) => {
        if (current() && method.startsWith("root/")) this.scheduleList();
      },
    });
    this.connection = connection;
    connection.start();
    void connection.subscribe("ahp-root://").catch(() => undefined);
    this.applyRole();
  }

  private showState(state: ConnectionState): void {
    const indicator = $("#connection");
    indicator.dataset.state = state.kind;
    switch (state.kind) {
      case "connecting":
        indicator.textContent = "Connecting…";
        break;
      case "connected":
        indicator.textContent = "Connected";
        if (this.current) void this.refreshView();
        this.scheduleList();
        break;
      case "reconnecting":
        indicator.textContent = `Reconnecting in ${(state.inMs / 1000).toFixed(1)} s (${state.reason})`;
        break;
      case "offline":
        indicator.textContent = `Offline (${state.reason})`;
        break;
      case "unauthorized":
        indicator.textContent = "Not signed in";
        void this.checkToken();
        break;
    }
  }

  private applyRole(): void {
    // What a viewer may not do is not offered (the server refuses it anyway).
    document.body.classList.toggle("viewer", roleOf(this.token) === "viewer");
  }

  // ─── The session list ───────────────────────────────────────────────

  private async loadAgents(): Promise<void> {
    const { status, body } = await this.api("/v1/agents");
    if (status !== 200) return;
    const select = $<HTMLSelectElement>("#create-provider");
    select.replaceChildren(
      ...body.agents.map((agent: { provider: string; displayName: string }) =>
        element("option", { value: agent.provider }, `${agent.displayName} (${agent.provider})`),
      ),
    );
  }

  private scheduleList(): void {
    window.clearTimeout(this.listTimer);
    this.listTimer = window.setTimeout(() => void this.loadSessions(), 100);
  }

  private async loadSessions(): Promise<void> {
    const filters = new FormData($<HTMLFormElement>("#filters"));
    const query = new URLSearchParams({ limit: "200" });
    for (const key of ["project", "state"]) {
      const value = String(filters.get(key) ?? "");
      if (value) query.set(key, value);
    }
    const { status, body } = await this.api(`/v1/sessions?${query}`);
    if (status !== 200) return;
    const list = $("#session-list");
    list.replaceChildren(
      ...(body.items as SessionView[]).map((s) => {
        const button = element(
          "button",
          { type: "button", "data-session": s.id, "aria-current": String(this.current?.id === s.id) },
          element("span", { class: "title" }, s.title || s.id),
          element("span", { class: `badge ${s.state}` }, s.state),
          element("span", { class: "meta" }, `${s.provider} · ${s.project} · ${s.turns} turns${s.resumable ? " · resumable" : ""} · ${new Date(s.updatedAt).toLocaleString()}`),
        );
        button.addEventListener("click", () => void this.open(s.id));
        return element("li", {}, button);
      }),
    );
    if (!body.items.length) list.replaceChildren(element("li", { class: "empty" }, "No sessions yet. Create one below."));
  }

  // ─── One session ────────────────────────────────────────────────────

  private async open(id: string): Promise<void> {
    const connection = this.connection;
    if (!connection) return;
    if (this.current) {
      await connection.unsubscribe(this.current.resource);
      if (this.current.defaultChat) await connection.unsubscribe(this.current.defaultChat);
    }
    const { status, body } = await this.api(`/v1/sessions/${encodeURIComponent(id)}`);
    if (status !== 200) return;
    this.current = body as SessionView;
    this.turns.clear();
    this.rows = 0;
    $("#envelopes").replaceChildren();
    $("#notice").textContent = "";
    for (const slot of document.querySelectorAll<HTMLElement>("#session .error")) slot.textContent = "";
    $("#session").hidden = false;
    const session = await connection.subscribe(this.current.resource);
    if (this.current.defaultChat) {
      const chat = await connection.subscribe(this.current.defaultChat);
      this.loadChat(chat.state);
    }
    this.renderView(session.state);
    this.renderTurns();
    this.scheduleList();
    void this.loadContext();
  }

  private async refreshView(): Promise<void> {
    if (!this.current) return;
    const { status, body } = await this.api(`/v1/sessions/${encodeURIComponent(this.current.id)}`);
    if (status === 200) {
      this.current = body;
      this.renderView(null);
    }
  }

  private renderView(state: Record<string, unknown> | null): void {
    const view = this.current;
    if (!view) return;
    $("#session-title").textContent = view.title || view.id;
    const facts: [string, string][] = [
      ["State", view.cause ? `${view.state} (${view.cause})` : view.state],
      ["Agent", view.provider],
      ["Project", view.project],
      ["Turns", String(view.turns)],
      ["Open turn", view.projection.openTurnId ?? "none"],
      ["Resumable", view.resumable ? "yes" : "no"],
      ["Document revision", String(view.projection.documentRevision)],
      ["Commands", view.projection.commands.map((c) => c.name).join(", ") || "none"],
    ];
    $("#projection").replaceChildren(...facts.flatMap(([k, v]) => [element("dt", {}, k), element("dd", {}, v)]));
    const dirs = (state?.workingDirectories as string[] | undefined) ?? view.workingDirectories;
    $("#dirs").replaceChildren(
      ...dirs.map((uri, index) => {
        const path = decodeURIComponent(uri.replace(/^file:\/\//, ""));
        const remove = element("button", { type: "button", "data-writes": "" }, "Remove");
        remove.setAttribute("aria-label", `Remove ${path}`);
        remove.addEventListener("click", () => void this.send(this.current!.resource, { type: "session/workingDirectoryRemoved", directory: uri }, $("#add-dir")));
        return element("li", {}, element("code", {}, path), index === 0 ? element("span", { class: "meta" }, " primary") : remove);
      }),
    );
    $("#replace-dir").querySelector("select")!.replaceChildren(
      ...dirs.map((uri) => element("option", { value: uri }, decodeURIComponent(uri.replace(/^file:\/\//, "")))),
    );
    $("#resume").hidden = !(view.resumable && ["dormant", "closed"].includes(view.state));
    this.applyRole();
  }

  private async loadContext(): Promise<void> {
    const view = this.current;
    if (!view) return;
    const { status, body } = await this.api(`/v1/projects/${encodeURIComponent(view.project)}/sessions/${encodeURIComponent(view.id)}/working-context`);
    const panel = $("#context");
    if (status !== 200 || !body.found) {
      panel.textContent = "No working context saved for this session.";
      return;
    }
    const working = body.working;
    panel.replaceChildren(
      element("p", {}, `Goal: ${working.goal ?? "none"}`),
      element("p", {}, `Decisions: ${(working.decisions ?? []).length}, pending actions: ${(working.pendingActions ?? []).length}`),
    );
  }

  private loadChat(state: Record<string, any>): void {
    const all = [...((state.turns as any[]) ?? [])];
    if (state.activeTurn) all.push({ ...state.activeTurn, state: "running" });
    for (const turn of all) {
      const view: TurnView = { id: turn.id, text: turn.message?.text ?? "", parts: new Map(), tools: new Map(), state: String(turn.state ?? "complete") };
      for (const part of turn.responseParts ?? []) this.applyPart(view, part);
      this.turns.set(turn.id, view);
    }
  }

  private applyPart(turn: TurnView, part: any): void {
    if (part.kind === "markdown" || part.kind === "reasoning") {
      turn.parts.set(part.id, { kind: part.kind, text: part.content ?? "" });
    } else if (part.kind === "toolCall") {
      const call = part.toolCall;
      turn.tools.set(call.toolCallId, { id: call.toolCallId, name: call.displayName ?? call.toolName, status: call.status, options: call.options ?? [] });
    }
  }

  private onEnvelope(envelope: Envelope): void {
    if (envelope.rejectionReason !== undefined) {
      const form = envelope.origin ? this.sentFrom.get(envelope.origin.clientSeq) : undefined;
      if (form) this.showError(form, envelope.rejectionReason);
      return;
    }
    if (!this.current) return;
    if (envelope.channel !== this.current.resource && envelope.channel !== this.current.defaultChat) return;
    this.appendRow(envelope);
    if (envelope.channel === this.current.defaultChat) {
      this.applyChat(envelope.action);
      this.scheduleTurns();
    }
    // The projection (state, turns, open turn) follows, at most ten times a second.
    window.clearTimeout(this.viewTimer);
    this.viewTimer = window.setTimeout(() => void this.refreshView(), 100);
  }

  private onSnapshots(snapshots: Snapshot[], reason: string): void {
    $("#notice").textContent = `Re-rendered from snapshots: ${reason}.`;
    this.turns.clear();
    for (const snapshot of snapshots) {
      if (snapshot.resource === this.current?.defaultChat) this.loadChat(snapshot.state);
      if (snapshot.resource === this.current?.resource) this.renderView(snapshot.state);
    }
    this.renderTurns();
  }

  private appendRow(envelope: Envelope): void {
    const list = $("#envelopes");
    const row = element("li", { "data-seq": String(envelope.serverSeq) }, element("span", { class: "seq" }, `#${envelope.serverSeq}`), ` ${envelope.action.type}`);
    list.append(row);
    this.rows += 1;
    // Only the newest rows stay in the page; the transcript has the rest.
    while (this.rows > MAX_ROWS && list.firstElementChild) {
      list.firstElementChild.remove();
      this.rows -= 1;
    }
  }

  private applyChat(action: Action): void {
    const id = String(action.turnId ?? "");
    if (action.type === "chat/turnStarted") {
      const message = action.message as { text?: string } | undefined;
      this.turns.set(id, { id, text: message?.text ?? "", parts: new Map(), tools: new Map(), state: "running" });
      return;
    }
    const turn = this.turns.get(id);
    if (!turn) return;
    switch (action.type) {
      case "chat/responsePart":
        this.applyPart(turn, action.part);
        break;
      case "chat/delta":
      case "chat/reasoning": {
        const part = turn.parts.get(String(action.partId));
        if (part) part.text += String(action.content ?? "");
        break;
      }
      case "chat/toolCallStart":
        turn.tools.set(String(action.toolCallId), { id: String(action.toolCallId), name: String(action.displayName ?? action.toolName), status: "streaming", options: [] });
        break;
      case "chat/toolCallReady": {
        const tool = turn.tools.get(String(action.toolCallId));
        if (tool) {
          tool.status = action.confirmed ? "running" : "pending-confirmation";
          tool.options = (action.options as ToolView["options"]) ?? [];
        }
        break;
      }
      case "chat/toolCallConfirmed": {
        const tool = turn.tools.get(String(action.toolCallId));
        if (tool) tool.status = action.approved ? "running" : "cancelled";
        break;
      }
      case "chat/toolCallComplete": {
        const tool = turn.tools.get(String(action.toolCallId));
        const result = action.result as { success?: boolean; content?: { text?: string }[] } | undefined;
        if (tool) {
          tool.status = result?.success ? "completed" : "failed";
          tool.result = (result?.content ?? []).map((c) => c.text ?? "").join("\n");
        }
        break;
      }
      case "chat/turnComplete":
        turn.state = "complete";
        break;
      case "chat/turnCancelled":
        turn.state = "cancelled";
        break;
      case "chat/error": {
        turn.state = "error";
        const part = action.part as { error?: { message?: string } } | undefined;
        turn.error = part?.error?.message;
        break;
      }
    }
  }

  /** Renders the conversation at most once a frame, however fast the
   * deltas come. */
  private scheduleTurns(): void {
    if (this.renderQueued) return;
    this.renderQueued = true;
    requestAnimationFrame(() => {
      this.renderQueued = false;
      this.renderTurns();
    });
  }

  private renderTurns(): void {
    const list = $("#turns");
    list.replaceChildren(
      ...[...this.turns.values()].map((turn) => {
        const answer = element("div", { class: "answer" });
        for (const part of turn.parts.values()) {
          answer.append(element("p", { class: part.kind }, part.text));
        }
        for (const tool of turn.tools.values()) {
          const item = element("div", { class: "tool", "data-status": tool.status }, element("strong", {}, tool.name), ` — ${tool.status}`);
          if (tool.result) item.append(element("pre", {}, tool.result));
          if (tool.status === "pending-confirmation") {
            const options = tool.options.length ? tool.options : [{ id: "", label: "Approve", kind: "approve" }, { id: "", label: "Deny", kind: "deny" }];
            for (const option of options) {
              const button = element("button", { type: "button", "data-writes": "" }, option.label);
              button.addEventListener("click", () => {
                const action: Action = { type: "chat/toolCallConfirmed", turnId: turn.id, toolCallId: tool.id, approved: option.kind === "approve" };
                if (option.id) action.selectedOptionId = option.id;
                void this.send(this.current!.defaultChat!, action, $("#turn"));
              });
              item.append(" ", button);
            }
          }
          answer.append(item);
        }
        if (turn.error) answer.append(element("p", { class: "error" }, turn.error));
        return element("li", { "data-turn": turn.id, "data-state": turn.state }, element("p", { class: "user" }, turn.text), answer, element("span", { class: "meta" }, turn.state));
      }),
    );
    const running = [...this.turns.values()].some((t) => t.state === "running");
    $<HTMLButtonElement>("#cancel").disabled = !running;
    this.applyRole();
  }

  // ─── Writing ────────────────────────────────────────────────────────

  private async send(channel: string, action: Action, form: HTMLElement): Promise<void> {
    const connection = this.connection;
    if (!connection) return;
    this.showError(form, "");
    const seq = await connection.dispatch(channel, action);
    this.sentFrom.set(seq, form);
  }

  private showError(form: HTMLElement, message: string): void {
    const slot = form.querySelector<HTMLElement>(".error");
    if (slot) slot.textContent = message;
  }

  private bindForms(): void {
    $<HTMLFormElement>("#filters").addEventListener("input", () => this.scheduleList());
    $<HTMLFormElement>("#create").addEventListener("submit", async (event) => {
      event.preventDefault();
      const form = event.currentTarget as HTMLFormElement;
      const data = new FormData(form);
      const dir = String(data.get("dir") ?? "").trim();
      const { status, body } = await this.api("/v1/sessions", {
        method: "POST",
        body: JSON.stringify({ provider: data.get("provider"), workingDirectories: dir ? [dir] : [] }),
      });
      if (status === 201) {
        this.showError(form, "");
        await this.loadSessions();
        await this.open(body.id);
      } else {
        this.showError(form, body?.detail ?? `The server answered ${status}.`);
      }
    });
    $<HTMLFormElement>("#turn").addEventListener("submit", (event) => {
      event.preventDefault();
      const form = event.currentTarget as HTMLFormElement;
      const input = form.elements.namedItem("text") as HTMLTextAreaElement;
      const text = input.value.trim();
      if (!text || !this.current?.defaultChat) return;
      input.value = "";
      void this.send(this.current.defaultChat, {
        type: "chat/turnStarted",
        turnId: crypto.randomUUID(),
        startedAt: new Date().toISOString(),
        message: { text, origin: { kind: "user" } },
      }, form);
    });
    $<HTMLButtonElement>("#cancel").addEventListener("click", () => {
      const running = [...this.turns.values()].find((t) => t.state === "running");
      if (running && this.current?.defaultChat) {
        void this.send(this.current.defaultChat, { type: "chat/turnCancelled", turnId: running.id, duration: 0 }, $("#turn"));
      }
    });
    $<HTMLFormElement>("#add-dir").addEventListener("submit", (event) => {
      event.preventDefault();
      const form = event.currentTarget as HTMLFormElement;
      const input = form.elements.namedItem("dir") as HTMLInputElement;
      const path = input.value.trim();
      if (!path || !this.current) return;
      void this.send(this.current.resource, { type: "session/workingDirectorySet", directory: toUri(path) }, form);
    });
    $<HTMLFormElement>("#replace-dir").addEventListener("submit", (event) => {
      event.preventDefault();
      const form = event.currentTarget as HTMLFormElement;
      const data = new FormData(form);
      const from = String(data.get("from") ?? "");
      const to = String(data.get("to") ?? "").trim();
      if (!from || !to || !this.current) return;
      void this.send(this.current.resource, { type: "session/workingDirectoryReplaced", directory: from, replacement: toUri(to) }, form);
    });
    $<HTMLButtonElement>("#resume").addEventListener("click", async () => {
      const view = this.current;
      if (!view) return;
      const [cwd, ...rest] = view.workingDirectories.map((u) => decodeURIComponent(u.replace(/^file:\/\//, "")));
      const { status, body } = await this.api(`/v1/sessions/${encodeURIComponent(view.id)}/resume`, {
        method: "POST",
        body: JSON.stringify({ sessionId: view.id, cwd: cwd ?? "/", additionalDirectories: rest, mcpServers: [] }),
      });
      this.showError($("#session-actions"), status === 200 ? "" : body?.detail ?? `The server answered ${status}.`);
      await this.refreshView();
    });
    $<HTMLFormElement>("#token-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const value = String(new FormData(event.currentTarget as HTMLFormElement).get("token") ?? "").trim();
      if (!value) return;
      this.token = value;
      sessionStorage.setItem(TOKEN_KEY, value);
      $<HTMLDialogElement>("#token").close();
      void this.start();
    });
  }
}

void new Console().start();
