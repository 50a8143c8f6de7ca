// The conversation as drawn: each turn (the person's message, the agent's
// answer as Markdown, its plan, tool cards with their diffs and output,
// permission prompts and questions), kept while it does not change.

import type { Action } from "../../sdk/typescript/src/index.js";
import { renderQuestion } from "./questions.js";
import { $, element, lineDiff, placeChildren, renderDiff, renderMarkdown } from "./render.js";
import type { EditView, ToolView, TurnView } from "./turns.js";

/** The agent's plan as last reported (`_meta["tether/plan"]`): the turn it belongs to and its steps. */
export interface Plan {
  turnId?: string;
  entries: { content: string; status: string; priority?: string }[];
}

/** What the conversation asks of the page. */
export interface ConversationHost {
  /** Dispatches an action on the session's chat; a refusal is shown in `form`. */
  send(action: Action, form: HTMLElement): void;
  /** A stored attachment's text (a file edit's side). */
  text(uri: string): Promise<string>;
}

const PLAN_MARKS: Record<string, string> = { completed: "✓", in_progress: "▸", pending: "○" };

export class Conversation {
  /** Drawn turns, kept while they do not change (a form being filled keeps its values). */
  private drawn = new Map<string, { key: string; node: HTMLElement }>();

  constructor(
    private readonly list: HTMLElement,
    private readonly host: ConversationHost,
  ) {}

  /** Forgets what was drawn (another session opens). */
  clear(): void {
    this.drawn.clear();
    this.list.replaceChildren();
  }

  /** Draws the turns, again only those that changed; follows the end when it was in view. */
  draw(turns: Iterable<TurnView>, plan: Plan | undefined): void {
    const list = this.list;
    const atBottom = list.scrollHeight - list.scrollTop - list.clientHeight < 40;
    const nodes = [...turns].map((turn) => {
      const own = plan?.turnId === turn.id ? plan : undefined;
      const key = JSON.stringify([turn.state, turn.error, turn.usage, own, [...turn.parts.values()], [...turn.tools.values()]]);
      const drawn = this.drawn.get(turn.id);
      if (drawn?.key === key) return drawn.node;
      const node = this.turn(turn, own);
      this.drawn.set(turn.id, { key, node });
      return node;
    });
    // Unchanged turns stay where they are: a press on one of their buttons
    // survives another turn's update (placeChildren).
    placeChildren(list, nodes);
    if (atBottom) list.scrollTop = list.scrollHeight;
  }

  private turn(turn: TurnView, plan: Plan | undefined): HTMLElement {
    const answer = element("div", { class: "answer" });
    if (plan?.entries.length) answer.append(this.plan(plan));
    for (const id of turn.order) {
      const part = turn.parts.get(id);
      if (part?.kind === "inputRequest") {
        answer.append(
          renderQuestion(part.request!, part.response, turn.state === "running", (action) => this.host.send(action as unknown as Action, answer)),
        );
      } else if (part) {
        const block = element("div", { class: `part ${part.kind}` });
        if (part.kind === "reasoning") {
          block.append(element("details", {}, element("summary", {}, "Thinking"), renderMarkdown(part.text)));
        } else {
          block.append(renderMarkdown(part.text));
        }
        answer.append(block);
      }
      const tool = turn.tools.get(id);
      if (tool) answer.append(this.tool(turn, tool));
    }
    if (turn.error) answer.append(element("p", { class: "error", role: "alert" }, turn.error));
    answer.append(element("p", { class: "error", role: "alert" }));
    const footer = element("p", { class: "meta" }, turn.state);
    if (turn.usage) {
      const cost = turn.usage.cost ? ` · ${turn.usage.cost.amount.toFixed(4)} ${turn.usage.cost.currency} so far` : "";
      footer.append(` · ${turn.usage.input} in / ${turn.usage.output} out tokens${turn.usage.model ? ` · ${turn.usage.model}` : ""}${cost}`);
    }
    const user = element("div", { class: "user" }, renderMarkdown(turn.text));
    if (turn.attachments) user.append(element("p", { class: "meta" }, `${turn.attachments} attachment${turn.attachments > 1 ? "s" : ""}`));
    return element("li", { "data-turn": turn.id, "data-state": turn.state }, user, answer, footer);
  }

  private plan(plan: Plan): HTMLElement {
    return element(
      "ol",
      { class: "plan", "aria-label": "The agent's plan" },
      ...plan.entries.map((entry) =>
        element(
          "li",
          { "data-status": entry.status },
          element("span", { class: "mark", "aria-hidden": "true" }, PLAN_MARKS[entry.status] ?? "○"),
          ` ${entry.content}`,
          element("span", { class: "meta" }, ` ${entry.status.replace("_", " ")}`),
        ),
      ),
    );
  }

  private tool(turn: TurnView, tool: ToolView): HTMLElement {
    const card = element("details", { class: "tool", "data-status": tool.status });
    if (tool.status === "pending-confirmation" || tool.edits.length) card.open = true;
    card.append(
      element("summary", {}, element("strong", {}, tool.name), " ", element("span", { class: `badge ${tool.status}` }, tool.status), tool.intention ? ` ${tool.intention}` : ""),
    );
    if (tool.input) card.append(element("h4", {}, "Input"), element("pre", {}, tool.input));
    for (const edit of tool.edits) card.append(this.edit(edit));
    if (tool.terminal) card.append(element("h4", {}, "Terminal"), element("pre", { class: "terminal" }, tool.terminal));
    if (tool.result) card.append(element("h4", {}, "Output"), element("pre", {}, tool.result));
    if (tool.status === "pending-confirmation") {
      const row = element("div", { class: "row", "data-writes": "" });
      const options = tool.options.length
        ? tool.options
        : [
            { id: "", label: "Approve", kind: "approve" },
            { id: "", label: "Deny", kind: "deny" },
          ];
      for (const option of options) {
        const approved = option.kind === "approve" || option.kind.startsWith("allow");
        const button = element("button", { type: "button", class: approved ? "primary" : "" }, option.label);
        button.addEventListener("click", () => {
          const action: Record<string, unknown> = { type: "chat/toolCallConfirmed", turnId: turn.id, toolCallId: tool.id, approved };
          if (option.id) action.selectedOptionId = option.id;
          this.host.send(action as Action, $("#turn"));
        });
        row.append(button);
      }
      card.append(row);
    }
    return card;
  }

  /** A file edit: its path and counts, and the diff once both sides are fetched. */
  private edit(edit: EditView): HTMLElement {
    const counts = edit.added !== undefined ? ` +${edit.added} −${edit.removed ?? 0}` : "";
    const box = element("figure", { class: "edit" }, element("figcaption", {}, element("code", {}, edit.path), counts));
    const side = (uri: string | undefined) => (uri ? this.host.text(uri) : Promise.resolve(""));
    void Promise.all([side(edit.before), side(edit.after)])
      .then(([before, after]) => box.append(renderDiff(lineDiff(before, after))))
      .catch((error) => box.append(element("p", { class: "meta" }, `The diff could not be loaded: ${(error as Error).message}`)));
    return box;
  }
}
