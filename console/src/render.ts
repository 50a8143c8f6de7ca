// What the console draws from text: DOM helpers, Markdown (sanitised, code
// highlighted) and line diffs. No network here and no state.

import DOMPurify from "dompurify";
import { Marked } from "marked";
import hljs from "highlight.js/lib/core";
import bash from "highlight.js/lib/languages/bash";
import diff from "highlight.js/lib/languages/diff";
import javascript from "highlight.js/lib/languages/javascript";
import json from "highlight.js/lib/languages/json";
import python from "highlight.js/lib/languages/python";
import rust from "highlight.js/lib/languages/rust";
import typescript from "highlight.js/lib/languages/typescript";
import yaml from "highlight.js/lib/languages/yaml";

for (const [name, language] of Object.entries({ bash, diff, javascript, json, python, rust, typescript, yaml })) {
  hljs.registerLanguage(name, language);
}
hljs.registerAliases(["sh", "shell", "console"], { languageName: "bash" });
hljs.registerAliases(["js"], { languageName: "javascript" });
hljs.registerAliases(["ts"], { languageName: "typescript" });
hljs.registerAliases(["py"], { languageName: "python" });
hljs.registerAliases(["rs"], { languageName: "rust" });
hljs.registerAliases(["yml"], { languageName: "yaml" });

export const $ = <T extends HTMLElement>(selector: string, root: ParentNode = document): T => {
  const found = root.querySelector<T>(selector);
  if (!found) throw new Error(`missing ${selector}`);
  return found;
};

export function element<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attributes: Record<string, string> = {},
  ...children: (Node | string)[]
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attributes)) node.setAttribute(key, value);
  node.append(...children);
  return node;
}

/**
 * Makes `parent`'s children exactly `nodes`, in order, moving only the
 * nodes out of place. `replaceChildren` would take every node out and put
 * it back, and the browser drops a click whose button was taken out
 * between its press and its release, even when it is put back at once.
 */
export function placeChildren(parent: Element, nodes: readonly Node[]): void {
  nodes.forEach((node, index) => {
    const there = parent.childNodes[index];
    if (there !== node) parent.insertBefore(node, there ?? null);
  });
  while (parent.childNodes.length > nodes.length) parent.lastChild!.remove();
}

/**
 * Draws `items` in `list` as buttons keyed by `attribute`: an item keeps
 * its button (and its list item) across redraws, left where it is
 * (`placeChildren`), so a redraw between a press and its release does not
 * swallow the click (clicks land on the button itself: style.css). `fill`
 * draws a button's content each time; `press` is bound once, when the
 * button is made.
 */
export function placeButtons<T>(
  list: HTMLElement,
  attribute: string,
  items: readonly T[],
  key: (item: T) => string,
  fill: (button: HTMLButtonElement, item: T) => void,
  press: (item: T) => void,
): void {
  const shown = new Map(
    Array.from(list.querySelectorAll<HTMLButtonElement>(`button[${attribute}]`), (b) => [b.getAttribute(attribute), b]),
  );
  placeChildren(
    list,
    items.map((item) => {
      let button = shown.get(key(item));
      if (!button) {
        button = element("button", { type: "button", [attribute]: key(item) });
        button.addEventListener("click", () => press(item));
      }
      fill(button, item);
      return button.parentElement ?? element("li", {}, button);
    }),
  );
}

const escapeHtml = (text: string) =>
  text.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]!);

const markdown = new Marked({
  gfm: true,
  breaks: false,
  renderer: {
    code({ text, lang }) {
      const language = (lang ?? "").trim().split(/\s+/)[0];
      const known = language && hljs.getLanguage(language);
      const body = known ? hljs.highlight(text, { language, ignoreIllegals: true }).value : escapeHtml(text);
      const label = language ? ` data-language="${escapeHtml(language)}"` : "";
      return `<pre class="code"${label}><code class="hljs">${body}</code></pre>`;
    },
  },
});

/**
 * Markdown as sanitised HTML: an agent's answer is untrusted text, so
 * anything that could run (scripts, handlers, `javascript:` links) is
 * removed, and links open elsewhere without the console's window.
 */
/** A search hit's snippet: its text, with only `<mark>` kept. */
export function renderSnippet(html: string): DocumentFragment {
  return DOMPurify.sanitize(html, { RETURN_DOM_FRAGMENT: true, ALLOWED_TAGS: ["mark"], ALLOWED_ATTR: [] });
}

export function renderMarkdown(text: string): DocumentFragment {
  const html = markdown.parse(text, { async: false }) as string;
  // No ids or names (an agent's element must not stand in for the page's
  // own, e.g. `<textarea id="message">`), and no form controls at all.
  const clean = DOMPurify.sanitize(html, {
    RETURN_DOM_FRAGMENT: true,
    SANITIZE_NAMED_PROPS: true,
    FORBID_TAGS: ["style", "form", "input", "textarea", "button", "select", "option"],
    FORBID_ATTR: ["id", "name", "form"],
  });
  // Every image says what it is (an agent's Markdown may give none).
  for (const image of clean.querySelectorAll("img")) {
    if (!image.hasAttribute("alt")) image.setAttribute("alt", "image");
  }
  for (const link of clean.querySelectorAll("a")) {
    link.setAttribute("rel", "noopener noreferrer");
    link.setAttribute("target", "_blank");
  }
  return clean;
}

/** One line of a unified diff: kept, removed or added. */
export interface DiffLine {
  kind: " " | "-" | "+";
  text: string;
}

/**
 * The line diff of two texts (longest common subsequence; texts over
 * 4,000 lines each are shown whole, as all removed then all added, rather
 * than freezing the page).
 */
export function lineDiff(before: string, after: string): DiffLine[] {
  const a = before === "" ? [] : before.replace(/\n$/, "").split("\n");
  const b = after === "" ? [] : after.replace(/\n$/, "").split("\n");
  if (a.length > 4000 || b.length > 4000) {
    return [...a.map((text) => ({ kind: "-" as const, text })), ...b.map((text) => ({ kind: "+" as const, text }))];
  }
  // Trim the common head and tail first: edits are usually small.
  let head = 0;
  while (head < a.length && head < b.length && a[head] === b[head]) head++;
  let tail = 0;
  while (tail < a.length - head && tail < b.length - head && a[a.length - 1 - tail] === b[b.length - 1 - tail]) tail++;
  const x = a.slice(head, a.length - tail);
  const y = b.slice(head, b.length - tail);
  const table: Uint32Array[] = Array.from({ length: x.length + 1 }, () => new Uint32Array(y.length + 1));
  for (let i = x.length - 1; i >= 0; i--) {
    for (let j = y.length - 1; j >= 0; j--) {
      table[i][j] = x[i] === y[j] ? table[i + 1][j + 1] + 1 : Math.max(table[i + 1][j], table[i][j + 1]);
    }
  }
  const middle: DiffLine[] = [];
  let i = 0;
  let j = 0;
  while (i < x.length || j < y.length) {
    if (i < x.length && j < y.length && x[i] === y[j]) {
      middle.push({ kind: " ", text: x[i++] });
      j++;
    } else if (j < y.length && (i === x.length || table[i][j + 1] >= table[i + 1][j])) {
      middle.push({ kind: "+", text: y[j++] });
    } else {
      middle.push({ kind: "-", text: x[i++] });
    }
  }
  const context = (lines: string[]) => lines.map((text) => ({ kind: " " as const, text }));
  return [...context(a.slice(Math.max(0, head - 3), head)), ...middle, ...context(a.slice(a.length - tail, a.length - tail + 3))];
}

/** A diff as a table: side by side when wide enough (CSS), with +/- marks. */
export function renderDiff(lines: DiffLine[]): HTMLElement {
  const body = element("tbody");
  for (const line of lines) {
    const kind = line.kind === "+" ? "added" : line.kind === "-" ? "removed" : "kept";
    body.append(element("tr", { class: kind }, element("td", { class: "mark", "aria-hidden": "true" }, line.kind), element("td", {}, element("code", {}, line.text))));
  }
  return element("table", { class: "diff" }, body);
}

/** A relative time for lists ("2 min ago"), with the full time as a title. */
export function when(iso: string): HTMLElement {
  const at = new Date(iso);
  const seconds = Math.round((Date.now() - at.getTime()) / 1000);
  const text =
    seconds < 60 ? "just now" : seconds < 3600 ? `${Math.round(seconds / 60)} min ago` : seconds < 86400 ? `${Math.round(seconds / 3600)} h ago` : at.toLocaleDateString();
  return element("time", { datetime: iso, title: at.toLocaleString() }, text);
}
