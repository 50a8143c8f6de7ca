// The conversation as the console holds it: turns built from a chat's
// snapshot and then from its envelopes, in order. Pure data; `view.ts`
// draws it.

import type { Action, ahp } from "../../sdk/typescript/src/index.js";

export interface EditView {
  path: string;
  before?: string;
  after?: string;
  added?: number;
  removed?: number;
}

export interface ToolView {
  id: string;
  name: string;
  status: string;
  intention?: string;
  input: string;
  options: { id: string; label: string; kind: string }[];
  result?: string;
  success?: boolean;
  edits: EditView[];
  terminal?: string;
}

export interface PartView {
  kind: string;
  text: string;
  /** An agent's question (`inputRequest` parts): AHP `ChatInputRequest`. */
  request?: Json;
  /** How the question was settled (`accept`, `decline`, `cancel`); absent while open. */
  response?: string;
}

export interface Usage {
  input: number;
  output: number;
  model?: string;
  cost?: { amount: number; currency: string };
}

export interface TurnView {
  id: string;
  text: string;
  attachments: number;
  /** Part and tool ids in the order they arrived. */
  order: string[];
  parts: Map<string, PartView>;
  tools: Map<string, ToolView>;
  state: string;
  error?: string;
  usage?: Usage;
  startedAt?: string;
}

type Json = Record<string, any>;

function newTurn(id: string, message: Json | undefined, state: string, startedAt?: string): TurnView {
  return {
    id,
    text: message?.text ?? "",
    attachments: (message?.attachments ?? []).length,
    order: [],
    parts: new Map(),
    tools: new Map(),
    state,
    startedAt,
  };
}

const pathOf = (uri: string) => decodeURIComponent(String(uri).replace(/^file:\/\//, ""));

function textOf(value: unknown): string {
  if (typeof value === "string") return value;
  if (value && typeof value === "object" && "markdown" in value) return String((value as Json).markdown);
  return "";
}

/** A tool call's result content, split into text, file edits and terminal output. */
function applyContent(tool: ToolView, content: Json[] | undefined): void {
  const texts: string[] = [];
  for (const item of content ?? []) {
    if (item.type === "text" && item.text) texts.push(item.text);
    if (item.type === "fileEdit") {
      const uri = item.after?.uri ?? item.before?.uri ?? "";
      tool.edits.push({
        path: pathOf(uri),
        before: item.before?.content?.uri,
        after: item.after?.content?.uri,
        added: item.diff?.added,
        removed: item.diff?.removed,
      });
    }
    if (item.type === "terminal") tool.terminal = item.result?.preview ?? tool.terminal;
  }
  if (texts.length) tool.result = texts.join("\n");
}

function toolFromState(call: Json): ToolView {
  const tool: ToolView = {
    id: call.toolCallId,
    name: call.displayName ?? call.toolName,
    status: call.status,
    intention: call.intention,
    input: typeof call.toolInput === "string" ? call.toolInput : "",
    options: call.options ?? [],
    edits: [],
  };
  applyContent(tool, call.content ?? call.result?.content);
  if (call.result) tool.success = call.result.success;
  return tool;
}

function applyPart(turn: TurnView, part: Json): void {
  if (part.kind === "markdown" || part.kind === "reasoning") {
    turn.parts.set(part.id, { kind: part.kind, text: part.content ?? "" });
    turn.order.push(part.id);
  } else if (part.kind === "inputRequest") {
    turn.parts.set(part.request.id, { kind: "inputRequest", text: part.request.message ?? "", request: part.request, response: part.response });
    turn.order.push(part.request.id);
  } else if (part.kind === "toolCall") {
    const tool = toolFromState(part.toolCall);
    turn.tools.set(tool.id, tool);
    turn.order.push(tool.id);
  }
}

/** The turns of a chat's state (from a snapshot). */
export function turnsOf(state: ahp.ChatState | Json): Map<string, TurnView> {
  const all: Json[] = [...((state as Json).turns ?? [])];
  if ((state as Json).activeTurn) all.push({ ...(state as Json).activeTurn, state: "running" });
  return viewsOf(all);
}

/** Turns (AHP `Turn`s, oldest first) as views. */
function viewsOf(all: Json[]): Map<string, TurnView> {
  const turns = new Map<string, TurnView>();
  for (const turn of all) {
    const view = newTurn(turn.id, turn.message, String(turn.state ?? "complete"), turn.startedAt);
    for (const part of turn.responseParts ?? []) applyPart(view, part);
    if (turn.usage) view.usage = usageOf(turn.usage);
    if (turn.error) view.error = turn.error.message;
    turns.set(turn.id, view);
  }
  return turns;
}

function usageOf(usage: Json): Usage {
  const meta = usage._meta ?? {};
  return {
    input: usage.inputTokens ?? meta["tether/inputTokens"] ?? 0,
    output: usage.outputTokens ?? meta["tether/outputTokens"] ?? 0,
    model: usage.model,
    cost: meta["tether/cost"],
  };
}

/** Applies one chat action; answers whether anything visible changed. */
export function applyChat(turns: Map<string, TurnView>, action: Action): boolean {
  const a = action as Json;
  const id = String(a.turnId ?? "");
  if (a.type === "chat/turnStarted") {
    turns.set(id, newTurn(id, a.message, "running", a.startedAt));
    return true;
  }
  if (a.type === "chat/inputRequested" || a.type === "chat/inputCompleted") return applyInput(turns, a);
  if (a.type === "chat/turnsLoaded") {
    // Older turns, ahead of those already here.
    const newer = [...turns];
    turns.clear();
    for (const [key, turn] of viewsOf(a.turns ?? [])) if (!newer.some(([k]) => k === key)) turns.set(key, turn);
    for (const [key, turn] of newer) turns.set(key, turn);
    return true;
  }
  const turn = turns.get(id);
  if (!turn) return false;
  const tool = a.toolCallId ? turn.tools.get(String(a.toolCallId)) : undefined;
  switch (a.type) {
    case "chat/responsePart":
      applyPart(turn, a.part);
      break;
    case "chat/delta":
    case "chat/reasoning": {
      let part = turn.parts.get(String(a.partId));
      if (!part) {
        part = { kind: a.type === "chat/delta" ? "markdown" : "reasoning", text: "" };
        turn.parts.set(String(a.partId), part);
        turn.order.push(String(a.partId));
      }
      part.text += String(a.content ?? "");
      break;
    }
    case "chat/toolCallStart": {
      const started: ToolView = { id: String(a.toolCallId), name: String(a.displayName ?? a.toolName), status: "streaming", intention: a.intention, input: "", options: [], edits: [] };
      turn.tools.set(started.id, started);
      turn.order.push(started.id);
      break;
    }
    case "chat/toolCallDelta":
      if (tool) tool.input += String(a.content ?? "");
      break;
    case "chat/toolCallReady":
      if (tool) {
        tool.status = a.confirmed ? "running" : "pending-confirmation";
        tool.options = a.options ?? [];
        if (typeof a.toolInput === "string") tool.input = a.toolInput;
        if (a.invocationMessage) tool.intention = textOf(a.invocationMessage);
        // The edits it will make, shown before anyone answers.
        const proposed: Json[] = a.edits?.items ?? [];
        if (proposed.length) {
          tool.edits = [];
          applyContent(tool, proposed.map((edit) => ({ ...edit, type: "fileEdit" })));
        }
      }
      break;
    case "chat/toolCallConfirmed":
      if (tool) tool.status = a.approved ? "running" : "cancelled";
      break;
    case "chat/toolCallContentChanged":
      if (tool) {
        tool.edits = [];
        applyContent(tool, a.content);
      }
      break;
    case "chat/toolCallComplete":
      if (tool) {
        tool.success = Boolean(a.result?.success);
        tool.status = tool.success ? "completed" : "failed";
        tool.edits = [];
        applyContent(tool, a.result?.content);
        if (!tool.result && !tool.success && a.result?.error) tool.result = JSON.stringify(a.result.error);
      }
      break;
    case "chat/usage": {
      // A report without a cost (tokens at the turn's end, from an agent
      // that reports them apart) keeps the cost reported before.
      const next = usageOf(a.usage ?? {});
      turn.usage = { ...next, cost: next.cost ?? turn.usage?.cost };
      break;
    }
    case "chat/turnComplete":
      turn.state = "complete";
      break;
    case "chat/turnCancelled":
      turn.state = "cancelled";
      break;
    case "chat/error":
      turn.state = "error";
      turn.error = a.part?.error?.message ?? a.error?.message;
      break;
    default:
      return false;
  }
  return true;
}

/** A question asked (into the running turn) or settled (wherever it is). */
function applyInput(turns: Map<string, TurnView>, a: Json): boolean {
  if (a.type === "chat/inputRequested") {
    const running = [...turns.values()].reverse().find((t) => t.state === "running");
    if (!running) return false;
    applyPart(running, { kind: "inputRequest", request: a.request });
    return true;
  }
  for (const turn of turns.values()) {
    const part = turn.parts.get(String(a.requestId));
    if (part?.kind === "inputRequest") {
      part.response = String(a.response);
      return true;
    }
  }
  return false;
}

/** The questions still waiting for an answer. */
export function openQuestions(turns: Iterable<TurnView>): number {
  let open = 0;
  for (const turn of turns) {
    for (const part of turn.parts.values()) if (part.kind === "inputRequest" && !part.response && turn.state === "running") open++;
    for (const tool of turn.tools.values()) if (tool.status === "pending-confirmation") open++;
  }
  return open;
}

/** Tokens summed over all turns, and the session's cost as last reported. */
export function totals(turns: Iterable<TurnView>): Usage {
  const sum: Usage = { input: 0, output: 0 };
  for (const turn of turns) {
    if (!turn.usage) continue;
    sum.input += turn.usage.input;
    sum.output += turn.usage.output;
    // ACP reports the session's cost so far: the latest report is the total.
    if (turn.usage.cost) sum.cost = turn.usage.cost;
  }
  return sum;
}
