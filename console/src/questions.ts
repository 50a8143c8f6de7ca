// An agent's question (AHP `ChatInputRequest`) as a form in the
// conversation, and the person's answer as `chat/inputCompleted`.

import { element, renderMarkdown } from "./render.js";

type Json = Record<string, any>;

/** The answer to send: `accept` with answers, or `decline`. */
export interface InputAnswer {
  type: "chat/inputCompleted";
  requestId: string;
  response: "accept" | "decline";
  answers?: Record<string, Json>;
}

function field(question: Json): { control: HTMLElement; read: () => Json | undefined } {
  const id = `q-${question.id}`;
  switch (question.kind) {
    case "single-select": {
      const select = element("select", { id, name: question.id }, element("option", { value: "" }, "—"));
      for (const option of question.options ?? []) {
        select.append(element("option", { value: option.id }, option.label + (option.recommended ? " (recommended)" : "")));
      }
      if (question.required) select.required = true;
      return { control: select, read: () => (select.value ? { kind: "selected", value: select.value } : undefined) };
    }
    case "multi-select": {
      const boxes = (question.options ?? []).map((option: Json) => {
        const box = element("input", { type: "checkbox", value: option.id });
        return { box, label: element("label", { class: "choice" }, box, ` ${option.label}`) };
      });
      const group = element("fieldset", { id }, ...boxes.map((b: { label: HTMLElement }) => b.label));
      return {
        control: group,
        read: () => {
          const chosen = boxes.filter((b: { box: HTMLInputElement }) => b.box.checked).map((b: { box: HTMLInputElement }) => b.box.value);
          return chosen.length ? { kind: "selected-many", value: chosen } : undefined;
        },
      };
    }
    case "boolean": {
      const box = element("input", { id, type: "checkbox" });
      box.checked = question.defaultValue === true;
      return { control: box, read: () => ({ kind: "boolean", value: box.checked }) };
    }
    case "number":
    case "integer": {
      const input = element("input", { id, type: "number", step: question.kind === "integer" ? "1" : "any" });
      if (question.min !== undefined) input.min = String(question.min);
      if (question.max !== undefined) input.max = String(question.max);
      if (question.required) input.required = true;
      return { control: input, read: () => (input.value === "" ? undefined : { kind: "number", value: Number(input.value) }) };
    }
    default: {
      const input = element("input", { id, type: "text", autocomplete: "off" });
      if (question.defaultValue) input.value = String(question.defaultValue);
      if (question.required) input.required = true;
      return { control: input, read: () => (input.value === "" ? undefined : { kind: "text", value: input.value }) };
    }
  }
}

/**
 * The question as a form; `answer` is called with what to dispatch. A
 * settled question shows how it was settled instead.
 */
export function renderQuestion(request: Json, response: string | undefined, open: boolean, answer: (action: InputAnswer) => void): HTMLElement {
  const box = element("div", { class: "question", "data-request": String(request.id), role: "group", "aria-label": "The agent asks" });
  box.append(element("strong", {}, "The agent asks"), renderMarkdown(String(request.message ?? "")));
  // Only web links: an agent's `javascript:` URL is shown, not linked.
  if (request.url) {
    const url = String(request.url);
    box.append(element("p", {}, /^https?:\/\//i.test(url) ? element("a", { href: url, target: "_blank", rel: "noopener noreferrer" }, url) : url));
  }
  if (response || !open) {
    box.append(element("p", { class: "meta" }, response ? `Answered: ${response}` : "Not answered"));
    return box;
  }
  const form = element("form", { "data-writes": "" });
  const fields = (request.questions ?? []).map((question: Json) => {
    const { control, read } = field(question);
    const label = element("label", { for: control.id }, question.title ?? question.message ?? question.id, question.required ? " *" : "");
    const row = element("div", { class: "field" }, label, control);
    if (question.title && question.message) row.append(element("span", { class: "meta" }, question.message));
    form.append(row);
    return { question, read };
  });
  const send = element("button", { type: "submit", class: "primary" }, "Answer");
  const decline = element("button", { type: "button" }, "Decline");
  form.append(element("div", { class: "row" }, send, decline), element("p", { class: "error", role: "alert" }));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const answers: Record<string, Json> = {};
    for (const { question, read } of fields) {
      const value = read();
      answers[question.id] = value === undefined ? { state: "skipped" } : { state: "submitted", value };
    }
    answer({ type: "chat/inputCompleted", requestId: String(request.id), response: "accept", answers });
  });
  decline.addEventListener("click", () => answer({ type: "chat/inputCompleted", requestId: String(request.id), response: "decline" }));
  box.append(form);
  return box;
}
