// The composer's parts that hold state of their own: attachments (picked,
// pasted or dropped), slash-command suggestions, and the pickers for the
// agent's configuration (model, mode, options). `app.ts` wires them to the
// stream.

import { $, element } from "./render.js";

/** An attachment as a turn carries it: AHP `embeddedResource`, base64. */
export interface Attachment {
  type: "embeddedResource";
  label: string;
  contentType: string;
  data: string;
  displayKind?: string;
}

/** At most this many bytes per attachment (the server has its own limit too). */
const MAX_ATTACHMENT = 8 * 1024 * 1024;

export class Attachments {
  private items: Attachment[] = [];

  constructor(
    private readonly list: HTMLElement,
    private readonly report: (message: string) => void,
  ) {}

  /** Takes files from a picker, a paste or a drop. */
  async add(files: Iterable<File>): Promise<void> {
    for (const file of files) {
      if (file.size > MAX_ATTACHMENT) {
        this.report(`${file.name || "The file"} is ${Math.round(file.size / 1024 / 1024)} MB; attachments are limited to 8 MB.`);
        continue;
      }
      const bytes = new Uint8Array(await file.arrayBuffer());
      let binary = "";
      for (let i = 0; i < bytes.length; i += 0x8000) binary += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
      const contentType = file.type || "application/octet-stream";
      this.items.push({
        type: "embeddedResource",
        label: file.name || (contentType.startsWith("image/") ? "pasted image" : "pasted file"),
        contentType,
        data: btoa(binary),
        displayKind: contentType.startsWith("image/") ? "image" : "document",
      });
    }
    this.render();
  }

  /** The attachments to send, and none left after. */
  take(): Attachment[] {
    const taken = this.items;
    this.items = [];
    this.render();
    return taken;
  }

  private render(): void {
    this.list.replaceChildren(
      ...this.items.map((item, index) => {
        const remove = element("button", { type: "button", "aria-label": `Remove ${item.label}` }, "×");
        remove.addEventListener("click", () => {
          this.items.splice(index, 1);
          this.render();
        });
        const preview = item.displayKind === "image" ? element("img", { src: `data:${item.contentType};base64,${item.data}`, alt: "" }) : "";
        return element("li", {}, preview, element("span", {}, item.label), remove);
      }),
    );
  }
}

/** Suggests the agent's slash commands while the message starts with `/`. */
export class Commands {
  private commands: { name: string; description?: string }[] = [];
  private shown: { name: string; description?: string }[] = [];
  private active = 0;

  constructor(
    private readonly input: HTMLTextAreaElement,
    private readonly list: HTMLElement,
  ) {
    input.setAttribute("aria-controls", list.id);
    input.setAttribute("aria-autocomplete", "list");
    input.addEventListener("input", () => this.update());
    input.addEventListener("blur", () => window.setTimeout(() => this.close(), 150));
  }

  set(commands: { name: string; description?: string }[]): void {
    this.commands = commands;
  }

  get open(): boolean {
    return this.shown.length > 0;
  }

  /** Keys while the suggestions are open; answers whether it used the key. */
  key(event: KeyboardEvent): boolean {
    if (!this.open) return false;
    if (event.key === "ArrowDown" || event.key === "ArrowUp") {
      this.active = (this.active + (event.key === "ArrowDown" ? 1 : this.shown.length - 1)) % this.shown.length;
      this.render();
      return true;
    }
    if (event.key === "Tab" || (event.key === "Enter" && !event.shiftKey)) {
      this.choose(this.shown[this.active].name);
      return true;
    }
    if (event.key === "Escape") {
      this.close();
      return true;
    }
    return false;
  }

  private update(): void {
    const match = this.input.value.match(/^\/(\S*)$/);
    this.shown = match ? this.commands.filter((c) => c.name.startsWith(match[1])).slice(0, 8) : [];
    this.active = 0;
    this.render();
  }

  private choose(name: string): void {
    this.input.value = `/${name} `;
    this.close();
    this.input.focus();
  }

  private close(): void {
    this.shown = [];
    this.render();
  }

  private render(): void {
    this.list.hidden = !this.open;
    this.list.replaceChildren(
      ...this.shown.map((command, index) => {
        const item = element(
          "li",
          { role: "option", id: `command-${index}`, "aria-selected": String(index === this.active) },
          element("code", {}, `/${command.name}`),
          " ",
          element("span", { class: "meta" }, command.description ?? ""),
        );
        item.addEventListener("mousedown", (event) => {
          event.preventDefault();
          this.choose(command.name);
        });
        return item;
      }),
    );
    if (this.open) this.input.setAttribute("aria-activedescendant", `command-${this.active}`);
    else this.input.removeAttribute("aria-activedescendant");
  }
}

/** A session's AHP config: a JSON schema of properties and their values. */
export interface SessionConfig {
  schema?: { properties?: Record<string, { title?: string; type?: string; enum?: unknown[]; enumLabels?: string[]; description?: string }> };
  values?: Record<string, unknown>;
}

/**
 * One picker per enum or boolean property the agent offers (model, mode,
 * thought level…); `change` dispatches the new value.
 */
export function renderConfig(box: HTMLElement, config: SessionConfig | undefined, change: (property: string, value: unknown) => void): void {
  const properties = Object.entries(config?.schema?.properties ?? {});
  box.replaceChildren(
    ...properties.flatMap(([name, schema]) => {
      const current = config?.values?.[name];
      const label = schema.title ?? name;
      if (schema.enum) {
        const select = element(
          "select",
          { name, "aria-label": label },
          ...schema.enum.map((value, i) => {
            const option = element("option", { value: JSON.stringify(value) }, schema.enumLabels?.[i] ?? String(value));
            option.selected = value === current;
            return option;
          }),
        );
        select.addEventListener("change", () => change(name, JSON.parse(select.value)));
        return [element("label", { class: "picker" }, `${label} `, select)];
      }
      if (schema.type === "boolean") {
        const box = element("input", { type: "checkbox", name });
        box.checked = current === true;
        box.addEventListener("change", () => change(name, box.checked));
        return [element("label", { class: "picker" }, box, ` ${label}`)];
      }
      return [];
    }),
  );
  box.hidden = properties.length === 0;
}

/** Turns the composer's drop zone and paste into attachments. */
export function acceptFiles(zone: HTMLElement, input: HTMLTextAreaElement, picker: HTMLInputElement, attachments: Attachments): void {
  picker.addEventListener("change", () => {
    void attachments.add(picker.files ?? []);
    picker.value = "";
  });
  input.addEventListener("paste", (event) => {
    const files = [...(event.clipboardData?.files ?? [])];
    if (files.length) {
      event.preventDefault();
      void attachments.add(files);
    }
  });
  zone.addEventListener("dragover", (event) => {
    event.preventDefault();
    zone.classList.add("dropping");
  });
  zone.addEventListener("dragleave", () => zone.classList.remove("dropping"));
  zone.addEventListener("drop", (event) => {
    event.preventDefault();
    zone.classList.remove("dropping");
    void attachments.add(event.dataTransfer?.files ?? []);
  });
  $("#attach").addEventListener("click", () => picker.click());
}
