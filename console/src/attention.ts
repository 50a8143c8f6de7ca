// Telling the person: a title badge counting what waits for them, and a
// browser notification (when permitted) when the open session needs input
// or a turn ends while the tab is hidden.

import { openQuestions, type TurnView } from "./turns.js";

export class Attention {
  private waiting = 0;
  private unseen = 0;
  private lastEnded: string | undefined;

  constructor() {
    document.addEventListener("visibilitychange", () => {
      if (!document.hidden) {
        this.unseen = 0;
        this.badge();
      }
    });
  }

  /** Asks for permission to notify, once (call it from a user's gesture). */
  ask(): void {
    if ("Notification" in window && Notification.permission === "default") void Notification.requestPermission();
  }

  /** Forgets the last session's turns (another session opens). */
  reset(): void {
    this.lastEnded = undefined;
    this.waiting = 0;
    this.badge();
  }

  /** Looks at the open session's turns after each change. */
  update(turns: Map<string, TurnView>, session: string, title: string): void {
    const waiting = openQuestions(turns.values());
    if (waiting > this.waiting) this.notify(session, `${title} needs you`, "The agent is waiting for an answer.");
    this.waiting = waiting;
    const last = [...turns.values()].pop();
    const ended = last && last.state !== "running" ? `${last.id}:${last.state}` : "";
    if (last && ended && ended !== this.lastEnded && this.lastEnded !== undefined && document.hidden) {
      this.notify(session, `${title}: turn ${last.state}`, last.error ?? "The agent finished its turn.");
    }
    this.lastEnded = ended;
    this.badge();
  }

  private notify(session: string, title: string, body: string): void {
    if (!document.hidden) return;
    this.unseen += 1;
    if ("Notification" in window && Notification.permission === "granted") {
      new Notification(title, { body, tag: `tether-${session}` });
    }
  }

  private badge(): void {
    const count = this.waiting + this.unseen;
    document.title = count ? `(${count}) Tether` : "Tether";
  }
}
