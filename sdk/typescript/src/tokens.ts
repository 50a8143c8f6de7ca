// Bearer tokens for a Tether with authentication on.
//
// A `TokenProvider` is asked for a token before every REST request and
// before every WebSocket connection. The AHP client also reconnects (and
// replays, so nothing is missed) shortly before a token expires, with a
// fresh one: the server closes a connection whose token has expired (close
// code 4003), and a client that waits for that loses a moment of stream.

/** A bearer token and, when known, when it stops being valid. */
export interface Token {
  value: string;
  /** Milliseconds since the epoch; `undefined` when unknown (no early refresh). */
  expiresAt?: number;
}

/**
 * Where the client gets its tokens: a fixed string, or a function that
 * answers a token valid now (it may fetch one; it is called again for each
 * connection and before expiry).
 */
export type TokenProvider = string | (() => Token | string | Promise<Token | string>);

/** The `exp` claim of a JWT, in milliseconds, if it has one. */
export function jwtExpiry(token: string): number | undefined {
  const exp = jwtClaims(token)?.exp;
  return typeof exp === "number" ? exp * 1000 : undefined;
}

/** The role and projects a token claims (the server checks them; a UI only reads them). */
export function jwtClaims(token: string): Record<string, unknown> | undefined {
  const payload = token.split(".")[1];
  if (!payload) return undefined;
  try {
    return JSON.parse(base64UrlDecode(payload)) as Record<string, unknown>;
  } catch {
    return undefined;
  }
}

function base64UrlDecode(text: string): string {
  const base64 = text.replace(/-/g, "+").replace(/_/g, "/");
  const padded = base64 + "=".repeat((4 - (base64.length % 4)) % 4);
  const binary = atob(padded);
  const bytes = Uint8Array.from(binary, (c) => c.charCodeAt(0));
  return new TextDecoder().decode(bytes);
}

/** Asks `provider` for a token now; `undefined` when there is no provider. */
export async function resolveToken(provider: TokenProvider | undefined): Promise<Token | undefined> {
  if (provider === undefined) return undefined;
  const answer = typeof provider === "string" ? provider : await provider();
  const token = typeof answer === "string" ? { value: answer } : answer;
  // An empty token is no token (a provider with nothing to give yet).
  if (!token.value) return undefined;
  return { value: token.value, expiresAt: token.expiresAt ?? jwtExpiry(token.value) };
}
