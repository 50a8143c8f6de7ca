// The Tether console, built on @tether/sdk: a session list that follows the
// root channel, and a session view that is the conversation (answers as
// Markdown, tool calls as cards with their diffs and output, permission
// prompts inline, usage per turn), with the session's details (state,
// projection, directories, working context, the envelopes in order) in a
// side panel. Everything updates from the stream in the same frame.

import {
  AhpClient,
  RestClient,
  TetherError,
  jwtClaims,
  jwtExpiry,
  type Action,
  type ConnectionState,
  type Envelope,
  type SessionView,
} from "../../sdk/typescript/src/index.js";
import { Attachments, Commands, acceptFiles, renderConfig, type SessionConfig } from "./composer.js";
import { Attention } from "./attention.js";
import { Conversation, type Plan } from "./conversation.js";
import { $, element, placeButtons, renderSnippet, when } from "./render.js";
import { applyChat, totals, turnsOf, type TurnView } from "./turns.js";

const TOKEN_KEY = "tether-token";
/** The longest delay `setTimeout` keeps. */
const MAX_TIMER = 2 ** 31 - 1;
/** Envelopes kept on the page; older ones are in the transcript (REST). */
const MAX_ROWS = 2_000;

/** A path (or a `file:` URI) as a `file:` URI; the server canonicalises it. */
function toUri(path: string): string {
  return path.startsWith("file:") ? path : `file://${path.startsWith("/") ? "" : "/"}${encodeURI(path)}`;
}

const pathOf = (uri: string) => decodeURIComponent(uri.replace(/^file:\/\//, ""));

class Console {
  private token = sessionStorage.getItem(TOKEN_KEY);
  private rest = this.newRest();
  private client: AhpClient | null = null;
  private current: SessionView | null = null;
  private turns = new Map<string, TurnView>();
  private rows = 0;
  private listTimer: number | undefined;
  private viewTimer: number | undefined;
  private renderQueued = false;
  /** Stored attachments (file edit sides) already fetched, by URI. */
  private texts = new Map<string, Promise<string>>();
  /** The open session's AHP state: its config and active clients. */
  private sessionState: Record<string, any> = {};
  /** The cursor of the chat's older turns (the snapshot holds the newest window), if there are more. */
  private olderTurns: string | undefined;
  /** The agent's plan as last reported (`_meta["tether/plan"]`). */
  private plan: Plan | undefined;
  private queued = new Map<string, string>();
  private attachments = new Attachments($("#attachments"), (message) => this.showError($("#turn"), message));
  private commands = new Commands($<HTMLTextAreaElement>("#message"), $("#commands"));
  private attention = new Attention();
  private conversation = new Conversation($("#turns"), {
    send: (action, form) => void this.send(this.current!.defaultChat!, action, form),
    text: (uri) => this.attachmentText(uri),
  });

  /** The forms' listeners are added once, however often `start` runs. */
  constructor() {
    this.bindForms();
    acceptFiles($("#turn"), $<HTMLTextAreaElement>("#message"), $<HTMLInputElement>("#files"), this.attachments);
  }

  private expiryTimer: number | undefined;

  /** Asks for a new token when this one expires (the server allows a short leeway, then closes the stream). */
  private watchExpiry(): void {
    window.clearTimeout(this.expiryTimer);
    const expiry = this.token ? jwtExpiry(this.token) : undefined;
    if (expiry === undefined) return;
    // setTimeout holds at most 2^31-1 ms (24.8 days): longer waits re-arm.
    const wait = expiry - Date.now();
    this.expiryTimer = window.setTimeout(
      () => (wait > MAX_TIMER ? this.watchExpiry() : this.askToken("Your token has expired. Enter a new one; the page stays as it is.")),
      Math.min(Math.max(0, wait), MAX_TIMER),
    );
  }

  async start(): Promise<void> {
    this.watchExpiry();
    if (!(await this.checkToken())) return;
    this.connect();
    await Promise.all([this.loadAgents(), this.loadSessions()]);
  }

  // ─── REST ───────────────────────────────────────────────────────────

  private newRest(): RestClient {
    return new RestClient({ baseUrl: location.origin, token: this.token ?? undefined });
  }

  /** Runs a REST call; a refused token opens the sign-in dialog; a failure is answered, never thrown. */
  private async call<T>(run: (rest: RestClient) => Promise<T>): Promise<T | TetherError> {
    try {
      return await run(this.rest);
    } catch (error) {
      if (error instanceof TetherError) {
        if (error.status === 401) this.askToken("The server refused the token: it is missing, wrong or expired. Enter a new one.");
        return error;
      }
      // The server cannot be reached (restarting, say): the stream's
      // indicator already says so, and the next `connected` reloads.
      return new TetherError(0, { code: "unreachable", detail: `The server cannot be reached: ${(error as Error).message}` });
    }
  }

  private async checkToken(): Promise<boolean> {
    const answer = await this.call((rest) => rest.sessions({ limit: 1 }));
    return !(answer instanceof TetherError && answer.status === 401);
  }

  private askToken(message: string): void {
    const dialog = $<HTMLDialogElement>("#token");
    $("#token-message").textContent = message;
    if (!dialog.open) dialog.showModal();
  }

  // ─── The connection ─────────────────────────────────────────────────

  private connect(): void {
    this.client?.close();
    const client = new AhpClient({
      url: `${location.protocol === "https:" ? "wss:" : "ws:"}//${location.host}/ahp`,
      // Asked at each connection: a token entered after one expired is
      // used by the next, and the view stays as it is.
      token: () => this.token ?? "",
      backoff: { initialMs: 500, maxMs: 10_000 },
    });
    this.client = client;
    // A replaced client may still report its close: only the current one
    // speaks to the page.
    const current = () => this.client === client;
    client.on("state", (state) => current() && this.showState(state));
    client.on("envelope", (envelope) => current() && this.onEnvelope(envelope));
    client.on("resynced", () => {
      if (!current()) return;
      $("#notice").textContent = "Re-rendered from snapshots: the gap was too large to replay.";
      this.turns.clear();
    });
    client.on("snapshot", (snapshot) => {
      if (!current() || !this.current) return;
      if (snapshot.resource === this.current.resource) {
        // After a resync: the session's own state (config, presence, plan) anew.
        this.sessionState = snapshot.state as Record<string, any>;
        this.plan = this.sessionState._meta?.["tether/plan"];
        this.renderConfig();
        this.renderPresence();
      }
      if (snapshot.resource === this.current.defaultChat) {
        this.turns = turnsOf(snapshot.state as object);
        this.olderTurns = (snapshot.state as { turnsNextCursor?: string }).turnsNextCursor;
        this.scheduleTurns();
      }
    });
    client.on("notification", (method) => current() && method.startsWith("root/") && this.scheduleList());
    client.on("gone", (channels) => {
      if (current() && this.current && channels.includes(this.current.resource)) {
        $("#notice").textContent = "This session no longer exists, or you may no longer see it.";
      }
    });
    void client
      .connect()
      .then(() => client.subscribe("ahp-root://"))
      .catch(() => undefined);
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
      case "closed":
        indicator.textContent = "Offline";
        break;
      case "unauthorized": {
        indicator.textContent = "Not signed in";
        const expiry = this.token ? jwtExpiry(this.token) : undefined;
        if (expiry !== undefined && expiry <= Date.now()) {
          this.askToken("Your token has expired. Enter a new one; the page stays as it is.");
        } else {
          void this.checkToken();
        }
        break;
      }
    }
  }

  /** What the token may do: a viewer sees everything, and every control that writes is disabled, with the reason. */
  private applyRole(): void {
    const role = this.token ? String(jwtClaims(this.token)?.role ?? "viewer") : "admin";
    const viewer = role === "viewer";
    document.body.classList.toggle("viewer", viewer);
    $("#role-note").hidden = !viewer;
    for (const control of document.querySelectorAll<HTMLButtonElement | HTMLInputElement | HTMLTextAreaElement | HTMLSelectElement>(
      "[data-writes] button, [data-writes] input, [data-writes] textarea, [data-writes] select, button[data-writes]",
    )) {
      if (viewer) {
        control.disabled = true;
        control.title = "Your token is a viewer's: it can read this session but not change it.";
      } else if (control.title.startsWith("Your token")) {
        control.disabled = false;
        control.title = "";
      }
    }
    if (!viewer) this.updateCancel();
  }

  // ─── The session list ───────────────────────────────────────────────

  private async loadAgents(): Promise<void> {
    const answer = await this.call((rest) => rest.agents());
    if (answer instanceof TetherError) return;
    $<HTMLSelectElement>("#create-provider").replaceChildren(
      ...answer.agents.map((agent) => element("option", { value: agent.provider }, `${agent.displayName} (${agent.provider})`)),
    );
    void this.loadCreateConfig();
    $<HTMLSelectElement>("#agent-filter").replaceChildren(
      element("option", { value: "" }, "any"),
      ...answer.agents.map((agent) => element("option", { value: agent.provider }, agent.displayName)),
    );
  }

  /** The chosen agent's settings for a new session (`resolveSessionConfig`), as pickers in the create form. */
  private createConfig: Record<string, unknown> = {};

  private async loadCreateConfig(): Promise<void> {
    const provider = $<HTMLSelectElement>("#create-provider").value;
    this.createConfig = {};
    const box = $("#create-config");
    box.replaceChildren();
    box.hidden = true;
    if (!provider || !this.client) return;
    try {
      await this.client.whenReady();
      const config = (await this.client.request("resolveSessionConfig", { provider })) as SessionConfig;
      if ($<HTMLSelectElement>("#create-provider").value !== provider) return;
      this.createConfig = { ...(config.values ?? {}) };
      renderConfig(box, config, (property, value) => {
        this.createConfig[property] = value;
      });
      this.applyRole();
    } catch {
      // An agent with no settings to offer, or none known yet: nothing to pick.
    }
  }

  private scheduleList(): void {
    window.clearTimeout(this.listTimer);
    this.listTimer = window.setTimeout(() => void this.loadSessions(), 100);
  }

  private async loadSessions(): Promise<void> {
    const filters = new FormData($<HTMLFormElement>("#filters"));
    const project = String(filters.get("project") ?? "") || undefined;
    const state = (String(filters.get("state") ?? "") || undefined) as SessionView["state"] | undefined;
    const search = String(filters.get("q") ?? "").trim().toLowerCase();
    const answer = await this.call((rest) => rest.sessions({ limit: 200, project, state }));
    if (answer instanceof TetherError) return;
    const agent = String(filters.get("agent") ?? "");
    const items = answer.items.filter((s) => (!search || `${s.title ?? ""} ${s.id}`.toLowerCase().includes(search)) && (!agent || s.provider === agent));
    const list = $("#session-list");
    placeButtons(
      list,
      "data-session",
      items,
      (s) => s.id,
      (button, s) => {
        button.setAttribute("aria-current", String(this.current?.id === s.id));
        button.replaceChildren(
          element("span", { class: "title" }, s.title || s.id),
          element("span", { class: `badge ${s.state}` }, s.state),
          // AHP's InputNeeded (24): a turn waits for the person (a permission or a question).
          (s.status & 24) === 24 ? element("span", { class: "badge pending-confirmation" }, "needs input") : "",
          element("span", { class: "meta" }, `${s.provider} · ${s.project} · ${s.turns} turns · `, when(s.updatedAt)),
        );
      },
      (s) => void this.open(s.id),
    );
    if (!items.length) list.replaceChildren(element("li", { class: "empty" }, search ? "No session title or id matches." : "No sessions yet. Create one below."));
    await this.searchTranscripts(String(filters.get("q") ?? "").trim(), project, state, agent || undefined);
  }

  /** Which search is the latest: an older answer arriving later is dropped. */
  private searching = 0;

  /** What was said, across the transcripts of this token's projects. */
  private async searchTranscripts(q: string, project?: string, state?: SessionView["state"], agent?: string): Promise<void> {
    const generation = ++this.searching;
    const found = $("#found");
    if (!q) {
      found.hidden = true;
      return;
    }
    const answer = await this.call((rest) => rest.search({ q, project, state, agent, limit: 20 }));
    if (generation !== this.searching) return;
    if (answer instanceof TetherError) {
      // Not a query it can run (no words yet, a filter it refuses): say why.
      found.hidden = false;
      $("#hits").replaceChildren(element("li", { class: "empty" }, answer.problem?.detail ?? answer.message));
      return;
    }
    found.hidden = false;
    // Hits are found again at each list refresh: like the sessions, a hit
    // keeps its button, left where it is.
    placeButtons(
      $("#hits"),
      "data-hit",
      answer.items,
      (hit) => `${hit.sessionId}:${hit.seq}`,
      (button, hit) =>
        button.replaceChildren(
          element("span", { class: "title" }, hit.title || hit.sessionId),
          element("span", { class: "badge" }, hit.kind),
          element("span", { class: "snippet" }, renderSnippet(hit.snippetHtml)),
          element("span", { class: "meta" }, `${hit.agent} · ${hit.project} · `, when(hit.at)),
        ),
      (hit) => void this.open(hit.sessionId, hit.turnId ?? undefined),
    );
    if (!answer.items.length) $("#hits").replaceChildren(element("li", { class: "empty" }, "Nothing said matches."));
  }

  // ─── One session ────────────────────────────────────────────────────

  /** Which `open` is the latest: an older one that finishes later gives way. */
  private opening = 0;

  private async open(id: string, turn?: string): Promise<void> {
    const client = this.client;
    if (!client) return;
    const generation = ++this.opening;
    if (this.current) this.leave(client, this.current);
    this.current = null;
    const answer = await this.call((rest) => rest.session(id));
    if (answer instanceof TetherError || generation !== this.opening) return;
    this.current = answer;
    this.turns.clear();
    this.olderTurns = undefined;
    this.conversation.clear();
    this.attention.reset();
    this.queued.clear();
    this.rows = 0;
    $("#envelopes").replaceChildren();
    $("#notice").textContent = "";
    for (const slot of document.querySelectorAll<HTMLElement>("#session .error")) slot.textContent = "";
    $("#session").hidden = false;
    $("#empty").hidden = true;
    // On a phone the session takes the screen; "← Sessions" brings the list back.
    document.body.classList.add("in-session");
    let snapshot;
    try {
      snapshot = await client.subscribe(answer.resource);
      if (generation !== this.opening) return client.unsubscribe(answer.resource);
      if (answer.defaultChat) await client.subscribe(answer.defaultChat);
      if (generation !== this.opening) return this.leave(client, answer);
    } catch (error) {
      // The connection dropped mid-way: open it again once it is back.
      $("#notice").textContent = `The session could not be followed (${(error as Error).message}); retrying.`;
      void client.whenReady().then(() => {
        if (generation === this.opening) void this.open(id);
      });
      return;
    }
    this.sessionState = snapshot.state as Record<string, any>;
    this.plan = this.sessionState._meta?.["tether/plan"];
    this.renderConfig();
    this.renderPresence();
    if (!this.isViewer()) {
      // Who is here: this console, as an active client of the session
      // (the server removes it when the connection has been gone a while).
      const name = this.token ? String(jwtClaims(this.token)?.sub ?? "console") : "console";
      void client.dispatch(answer.resource, { type: "session/activeClientSet", activeClient: { clientId: client.clientId, displayName: name, tools: [] } } as Action);
    }
    this.renderView();
    this.renderTurns();
    this.scheduleList();
    void this.loadContext();
    if (turn) this.reveal(turn);
    else $<HTMLTextAreaElement>("#message").focus();
  }

  /** Scrolls a turn into view and marks it (a search hit's place). */
  private reveal(turn: string): void {
    const item = [...document.querySelectorAll<HTMLElement>("#turns > li")].find((li) => li.dataset.turn === turn);
    if (!item) {
      $("#notice").textContent = "The turn found is older than the turns shown: load older turns to read it.";
      return;
    }
    for (const old of document.querySelectorAll(".found-turn")) old.classList.remove("found-turn");
    item.classList.add("found-turn");
    item.setAttribute("tabindex", "-1");
    item.scrollIntoView({ block: "center" });
    item.focus({ preventScroll: true });
  }

  /** Stops following a session, and says this console is no longer in it. */
  private leave(client: AhpClient, view: SessionView): void {
    const present = (this.sessionState.activeClients ?? []).some((c: { clientId: string }) => c.clientId === client.clientId);
    if (present) void client.dispatch(view.resource, { type: "session/activeClientRemoved", clientId: client.clientId } as Action).catch(() => undefined);
    client.unsubscribe(view.resource);
    if (view.defaultChat) client.unsubscribe(view.defaultChat);
  }

  private isViewer(): boolean {
    return document.body.classList.contains("viewer");
  }

  /** The agent's settings as pickers; a change is dispatched and shown once committed. */
  private renderConfig(): void {
    renderConfig($("#config"), this.sessionState.config as SessionConfig | undefined, (property, value) => {
      const view = this.current;
      if (!view) return;
      void this.send(view.resource, { type: "session/configChanged", config: { [property]: value } } as Action, $("#turn")).then(() => this.renderConfig());
    });
    this.applyRole();
  }

  /** Who else has this session open. */
  private renderPresence(): void {
    const me = this.client?.clientId;
    const others = (this.sessionState.activeClients ?? []).filter((c: { clientId: string }) => c.clientId !== me);
    $("#presence").textContent = others.length ? `Also here: ${others.map((c: { displayName?: string; clientId: string }) => c.displayName ?? c.clientId).join(", ")}` : "";
  }

  /** The session channel's own changes: config, presence. */
  private foldState(action: Record<string, any>): void {
    const state = this.sessionState;
    switch (action.type) {
      case "session/configChanged":
        state.config = { ...(state.config ?? {}), values: { ...(state.config?.values ?? {}), ...action.config } };
        this.renderConfig();
        break;
      case "session/activeClientSet":
        state.activeClients = [...(state.activeClients ?? []).filter((c: { clientId: string }) => c.clientId !== action.activeClient.clientId), action.activeClient];
        this.renderPresence();
        break;
      case "session/activeClientRemoved":
        state.activeClients = (state.activeClients ?? []).filter((c: { clientId: string }) => c.clientId !== action.clientId);
        this.renderPresence();
        break;
      case "session/metaChanged":
        if (action._meta?.["tether/plan"]) this.plan = action._meta["tether/plan"];
        break;
      case "chat/pendingMessageSet":
        this.queued.set(action.id, action.message?.text ?? "");
        break;
      case "chat/pendingMessageRemoved":
        this.queued.delete(action.id);
        break;
    }
  }

  private async refreshView(): Promise<void> {
    if (!this.current) return;
    const id = this.current.id;
    const answer = await this.call((rest) => rest.session(id));
    if (!(answer instanceof TetherError) && this.current?.id === id) {
      this.current = answer;
      this.renderView();
    }
  }

  /** The side panel: the session's state, projection and directories. */
  private renderView(): void {
    const view = this.current;
    if (!view) return;
    $("#session-title").textContent = view.title || view.id;
    $("#session-state").textContent = view.cause ? `${view.state} (${view.cause})` : view.state;
    $("#session-state").className = `badge ${view.state}`;
    const usage = totals(this.turns.values());
    const facts: [string, string][] = [
      ["State", view.cause ? `${view.state} (${view.cause})` : view.state],
      ["Agent", view.provider],
      ["Project", view.project],
      ["Turns", String(view.turns)],
      ["Open turn", view.projection.openTurnId ?? "none"],
      ["Resumable", view.resumable ? "yes" : "no"],
      ["Document revision", String(view.projection.documentRevision)],
      ["Commands", (view.projection.commands ?? []).map((c) => `/${c.name}`).join(" ") || "none"],
      ["Tokens", `${usage.input} in · ${usage.output} out`],
    ];
    if (usage.cost) facts.push(["Cost", `${usage.cost.amount.toFixed(4)} ${usage.cost.currency}`]);
    $("#projection").replaceChildren(...facts.flatMap(([k, v]) => [element("dt", {}, k), element("dd", {}, v)]));
    $("#dirs").replaceChildren(
      ...view.workingDirectories.map((uri, index) => {
        const remove = element("button", { type: "button", "data-writes": "" }, "Remove");
        remove.setAttribute("aria-label", `Remove ${pathOf(uri)}`);
        remove.addEventListener("click", () => void this.send(view.resource, { type: "session/workingDirectoryRemoved", directory: uri }, $("#add-dir")));
        return element("li", {}, element("code", {}, pathOf(uri)), index === 0 ? element("span", { class: "meta" }, " primary") : remove);
      }),
    );
    $("#replace-dir").querySelector("select")!.replaceChildren(...view.workingDirectories.map((uri) => element("option", { value: uri }, pathOf(uri))));
    $("#resume").hidden = !(view.resumable && ["dormant", "closed"].includes(view.state));
    this.commands.set(view.projection.commands ?? []);
    this.applyRole();
  }

  /** What the stream says about the session, applied to the projection at once (REST confirms it a moment later). */
  private foldSession(envelope: Envelope): void {
    const view = this.current;
    if (!view) return;
    const action = envelope.action as Record<string, any>;
    switch (action.type) {
      case "chat/turnStarted":
        view.turns += 1;
        view.projection.openTurnId = action.turnId;
        view.state = "live";
        view.cause = undefined;
        break;
      case "chat/turnComplete":
      case "chat/turnCancelled":
      case "chat/error":
        view.projection.openTurnId = undefined;
        break;
      case "session/titleChanged":
        view.title = action.title;
        break;
      case "session/workingDirectorySet":
        if (!view.workingDirectories.includes(action.directory)) view.workingDirectories.push(action.directory);
        break;
      case "session/workingDirectoryRemoved":
        view.workingDirectories = view.workingDirectories.filter((d) => d !== action.directory);
        break;
      case "session/workingDirectoryReplaced":
        view.workingDirectories = view.workingDirectories.map((d) => (d === action.directory ? action.replacement : d));
        break;
      case "x-tether/sessionSettled":
        view.state = action.state ?? view.state;
        view.cause = action.cause ?? view.cause;
        break;
    }
  }

  private async loadContext(): Promise<void> {
    const view = this.current;
    if (!view) return;
    const answer = await this.call((rest) => rest.workingContext(view.project, view.id));
    const panel = $("#context");
    if (answer instanceof TetherError || !answer.found || !answer.working) {
      panel.textContent = "No working context saved for this session.";
      return;
    }
    const working = answer.working as Record<string, any>;
    panel.replaceChildren(
      element("p", {}, `Goal: ${working.goal ?? "none"}`),
      element("p", {}, `Decisions: ${(working.decisions ?? []).length}, pending actions: ${(working.pendingActions ?? []).length}`),
    );
  }

  private onEnvelope(envelope: Envelope): void {
    if (!this.current) return;
    if (envelope.channel !== this.current.resource && envelope.channel !== this.current.defaultChat) return;
    this.appendRow(envelope);
    this.foldSession(envelope);
    this.foldState(envelope.action as Record<string, any>);
    if (envelope.channel === this.current.defaultChat) {
      applyChat(this.turns, envelope.action);
      if (envelope.action.type === "chat/turnsLoaded") this.olderTurns = (envelope.action as { turnsNextCursor?: string }).turnsNextCursor;
    }
    // Conversation and details are drawn together, once a frame.
    this.scheduleTurns();
    window.clearTimeout(this.viewTimer);
    this.viewTimer = window.setTimeout(() => void this.refreshView(), 250);
  }

  private appendRow(envelope: Envelope): void {
    const list = $("#envelopes");
    list.append(element("li", { "data-seq": String(envelope.serverSeq) }, element("span", { class: "seq" }, `#${envelope.serverSeq}`), ` ${envelope.action.type}`));
    this.rows += 1;
    // Only the newest rows stay in the page; the transcript has the rest.
    while (this.rows > MAX_ROWS && list.firstElementChild) {
      list.firstElementChild.remove();
      this.rows -= 1;
    }
  }

  /** Draws the conversation and the details at most once a frame, however fast the deltas come. */
  private scheduleTurns(): void {
    if (this.renderQueued) return;
    this.renderQueued = true;
    requestAnimationFrame(() => {
      this.renderQueued = false;
      this.renderTurns();
      this.renderView();
    });
  }

  private renderTurns(): void {
    this.conversation.draw(this.turns.values(), this.plan);
    $("#older").hidden = !this.olderTurns;
    const queued = [...this.queued.values()];
    $("#queue").textContent = queued.length ? `Queued after this turn: ${queued.map((t) => `“${t}”`).join(", ")}` : "";
    this.updateCancel();
    this.applyRole();
    if (this.current) this.attention.update(this.turns, this.current.id, this.current.title || this.current.id);
  }

  /** A stored attachment's text (a file edit's side), fetched once. */
  private attachmentText(uri: string): Promise<string> {
    let text = this.texts.get(uri);
    if (!text) {
      const digest = uri.replace(/^tether-attachment:/, "").split("/").pop() ?? "";
      const id = this.current!.id;
      text = this.rest.request("get", "/v1/sessions/{id}/attachments/{digest}", { path: { id, digest } }).then(String);
      this.texts.set(uri, text);
    }
    return text;
  }

  private updateCancel(): void {
    const running = [...this.turns.values()].some((t) => t.state === "running");
    $<HTMLButtonElement>("#cancel").disabled = !running || document.body.classList.contains("viewer");
  }

  // ─── Writing ────────────────────────────────────────────────────────

  /** Dispatches an action and shows its refusal, if any, beside `form`. */
  private async send(channel: string, action: Action, form: HTMLElement): Promise<void> {
    const client = this.client;
    if (!client) return;
    this.showError(form, "");
    try {
      const outcome = await client.dispatch(channel, action);
      if (!outcome.accepted) this.showError(form, outcome.reason);
    } catch (error) {
      this.showError(form, (error as Error).message);
    }
  }

  private showError(form: HTMLElement, message: string): void {
    const slot = form.querySelector<HTMLElement>(".error");
    if (slot) slot.textContent = message;
  }

  /** Sends the message as a turn, or queues it while a turn runs. */
  private sendTurn(): void {
    const input = $<HTMLTextAreaElement>("#message");
    const text = input.value.trim();
    if (!text || !this.current?.defaultChat) return;
    this.attention.ask();
    input.value = "";
    const attachments = this.attachments.take();
    const message = { text, origin: { kind: "user" }, ...(attachments.length ? { attachments } : {}) };
    const running = [...this.turns.values()].some((t) => t.state === "running");
    const action = running
      ? { type: "chat/pendingMessageSet", kind: "queued", id: crypto.randomUUID(), message }
      : { type: "chat/turnStarted", turnId: crypto.randomUUID(), startedAt: new Date().toISOString(), message };
    void this.send(this.current.defaultChat, action as Action, $("#turn"));
  }

  private bindForms(): void {
    $<HTMLFormElement>("#filters").addEventListener("input", () => this.scheduleList());
    $<HTMLSelectElement>("#create-provider").addEventListener("change", () => void this.loadCreateConfig());
    $<HTMLFormElement>("#filters").addEventListener("submit", (event) => event.preventDefault());
    $<HTMLButtonElement>("#older").addEventListener("click", async () => {
      const chat = this.current?.defaultChat;
      if (!chat || !this.client || !this.olderTurns) return;
      // The host loads them into the chat (`chat/turnsLoaded`), for every subscriber.
      try {
        await this.client.request("fetchTurns", { channel: chat, cursor: this.olderTurns });
      } catch (error) {
        $("#notice").textContent = `Older turns could not be loaded: ${(error as Error).message}`;
      }
    });
    $<HTMLButtonElement>("#back").addEventListener("click", () => {
      document.body.classList.remove("in-session");
      $<HTMLElement>("#sessions").querySelector<HTMLElement>("button, input")?.focus();
    });
    $<HTMLFormElement>("#create").addEventListener("submit", async (event) => {
      event.preventDefault();
      const form = event.currentTarget as HTMLFormElement;
      const data = new FormData(form);
      const dir = String(data.get("dir") ?? "").trim();
      const title = String(data.get("title") ?? "").trim();
      const config = Object.keys(this.createConfig).length ? (this.createConfig as never) : undefined;
      const answer = await this.call((rest) =>
        rest.createSession({ provider: String(data.get("provider") ?? "") || undefined, title: title || undefined, workingDirectories: dir ? [dir] : [], config }),
      );
      if (answer instanceof TetherError) {
        this.showError(form, answer.problem.detail ?? answer.message);
        return;
      }
      this.showError(form, "");
      await this.loadSessions();
      await this.open(answer.id);
    });
    $<HTMLFormElement>("#turn").addEventListener("submit", (event) => {
      event.preventDefault();
      this.sendTurn();
    });
    // Enter sends, Shift+Enter is a new line (as in every chat).
    $<HTMLTextAreaElement>("#message").addEventListener("keydown", (event) => {
      if (this.commands.key(event)) {
        event.preventDefault();
        return;
      }
      if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        this.sendTurn();
      }
    });
    $<HTMLButtonElement>("#cancel").addEventListener("click", () => {
      const running = [...this.turns.values()].find((t) => t.state === "running");
      if (running && this.current?.defaultChat) {
        void this.send(this.current.defaultChat, { type: "chat/turnCancelled", turnId: running.id, duration: 0 } as Action, $("#turn"));
      }
    });
    $<HTMLFormElement>("#add-dir").addEventListener("submit", (event) => {
      event.preventDefault();
      const form = event.currentTarget as HTMLFormElement;
      const path = (form.elements.namedItem("dir") as HTMLInputElement).value.trim();
      if (!path || !this.current) return;
      void this.send(this.current.resource, { type: "session/workingDirectorySet", directory: toUri(path) } as Action, form);
    });
    $<HTMLFormElement>("#replace-dir").addEventListener("submit", (event) => {
      event.preventDefault();
      const form = event.currentTarget as HTMLFormElement;
      const data = new FormData(form);
      const from = String(data.get("from") ?? "");
      const to = String(data.get("to") ?? "").trim();
      if (!from || !to || !this.current) return;
      void this.send(this.current.resource, { type: "session/workingDirectoryReplaced", directory: from, replacement: toUri(to) } as Action, form);
    });
    $<HTMLButtonElement>("#resume").addEventListener("click", async () => {
      const view = this.current;
      if (!view) return;
      const [cwd, ...rest] = view.workingDirectories.map(pathOf);
      const answer = await this.call((api) =>
        api.resume(view.id, { sessionId: view.id, cwd: cwd ?? "/", additionalDirectories: rest, mcpServers: [] } as never),
      );
      this.showError($("#session-actions"), answer instanceof TetherError ? answer.problem.detail ?? answer.message : "");
      await this.refreshView();
    });
    for (const format of ["markdown", "jsonl"] as const) {
      $<HTMLButtonElement>(`#export-${format}`).addEventListener("click", async () => {
        const view = this.current;
        if (!view) return;
        const text = await this.call((rest) => rest.export(view.id, format));
        if (text instanceof TetherError) {
          this.showError($("#session-actions"), text.problem.detail ?? text.message);
          return;
        }
        // A download of what the server rendered (a link could not carry the token).
        const type = format === "markdown" ? "text/markdown" : "application/jsonl";
        const link = element("a", { href: URL.createObjectURL(new Blob([text], { type })), download: `${view.id}.${format === "markdown" ? "md" : "jsonl"}` });
        link.click();
        window.setTimeout(() => URL.revokeObjectURL(link.href), 1000);
      });
    }
    $<HTMLFormElement>("#token-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const value = String(new FormData(event.currentTarget as HTMLFormElement).get("token") ?? "").trim();
      if (!value) return;
      this.token = value;
      this.rest = this.newRest();
      sessionStorage.setItem(TOKEN_KEY, value);
      $<HTMLDialogElement>("#token").close();
      if (this.client) {
        // A token for a page already open (the last one expired): the
        // stream reconnects with it and replays; the view stays.
        this.watchExpiry();
        this.applyRole();
        this.client.reconnect();
        void this.loadSessions();
      } else {
        void this.start();
      }
    });
  }
}

void new Console().start();
