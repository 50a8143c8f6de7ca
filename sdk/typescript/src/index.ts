// @tether/sdk: a client library for Tether, the durable AHP session host.
//
// - `AhpClient`: the live stream over WebSocket (subscribe, dispatch,
//   resume with no gap and no duplicate, durable origins, token refresh).
// - `RestClient`: every REST operation, typed from the OpenAPI document.
// - `Tether`: both, sharing one server address and token provider.

export * from "./ahp.js";
export * from "./rest.js";
export * from "./tokens.js";
export type * as ahp from "./ahp-types.js";
export type { components, operations, paths } from "./openapi.js";

import { AhpClient, type AhpClientOptions } from "./ahp.js";
import { RestClient } from "./rest.js";

/** A Tether server: its REST API and its AHP stream, with one address and one token provider. */
export class Tether {
  readonly rest: RestClient;
  readonly ahp: AhpClient;

  constructor(options: AhpClientOptions & { fetch?: typeof fetch }) {
    const base = options.url.replace(/^ws/, "http").replace(/\/ahp\/?$/, "");
    this.rest = new RestClient({ baseUrl: base, token: options.token, fetch: options.fetch });
    this.ahp = new AhpClient(options);
  }
}

/** The AHP channel of a session. */
export const sessionChannel = (id: string): string => `ahp-session:/${id}`;
/** The channel of the root state (agents, active sessions). */
export const ROOT_CHANNEL = "ahp-root://";
