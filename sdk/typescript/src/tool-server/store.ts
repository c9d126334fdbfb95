/**
 * The idempotency-key store of a tool server: what each key's request was and what it was
 * answered, so that a replay (Sluice retries with the same key) gets the stored answer instead
 * of running the effect again.
 *
 * The store's durability is the tool's: an answer is only as replayable as the store keeps it.
 * {@link MemoryStore} forgets everything when the process exits, which suits tests and
 * development; a production tool implements {@link IdempotencyStore} on its own database,
 * ideally in the transaction that commits the effect.
 */

import { createHash } from "node:crypto";

/** An answer as it was sent, to be sent again for a replay. */
export interface StoredAnswer {
  status: number;
  body: unknown;
}

/** What a key holds: the request's fingerprint, and its answer once there is one. */
export interface StoredEntry {
  fingerprint: string;
  /** `undefined` while the first request with the key is still running. */
  answer: StoredAnswer | undefined;
}

/** Where a tool server remembers idempotency keys. Every method must be atomic per key. */
export interface IdempotencyStore {
  /**
   * Claims `key` for a request with `fingerprint` and returns `undefined`, or, when the key is
   * already claimed, returns what it holds and claims nothing.
   */
  begin(key: string, fingerprint: string): Promise<StoredEntry | undefined>;
  /** Records the answer of the request that claimed `key`. */
  finish(key: string, answer: StoredAnswer): Promise<void>;
  /** Releases a claim whose request ended without an answer worth replaying (it threw). */
  abandon(key: string): Promise<void>;
}

/** An in-process store: replays are answered until the process exits. */
export class MemoryStore implements IdempotencyStore {
  readonly #entries = new Map<string, StoredEntry>();

  async begin(key: string, fingerprint: string): Promise<StoredEntry | undefined> {
    const entry = this.#entries.get(key);
    if (entry !== undefined) {
      return { ...entry };
    }
    this.#entries.set(key, { fingerprint, answer: undefined });
    return undefined;
  }

  async finish(key: string, answer: StoredAnswer): Promise<void> {
    const entry = this.#entries.get(key);
    if (entry !== undefined) {
      entry.answer = answer;
    }
  }

  async abandon(key: string): Promise<void> {
    this.#entries.delete(key);
  }
}

/**
 * The SHA-256 of `value`'s canonical JSON (object keys sorted at every depth), so the same
 * arguments sent with other key order or spacing have the same fingerprint.
 */
export function fingerprint(value: unknown): string {
  return createHash("sha256").update(canonicalJson(value)).digest("hex");
}

function canonicalJson(value: unknown): string {
  if (Array.isArray(value)) {
    return `[${value.map(canonicalJson).join(",")}]`;
  }
  if (typeof value === "object" && value !== null) {
    const entries = Object.entries(value as Record<string, unknown>)
      .filter(([, item]) => item !== undefined)
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    return `{${entries.map(([key, item]) => `${JSON.stringify(key)}:${canonicalJson(item)}`).join(",")}}`;
  }
  return JSON.stringify(value) ?? "null";
}
