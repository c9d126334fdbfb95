/**
 * Verifying that a request to a `ToolServer` comes from Sluice.
 *
 * Sluice signs every call to a tool service with the Standard Webhooks scheme
 * (https://www.standardwebhooks.com): a `webhook-id` unique to the request, a
 * `webhook-timestamp` in unix seconds, and a `webhook-signature` holding one
 * `v1,<base64 HMAC-SHA256>` entry per key Sluice holds, each over
 * `{webhook-id}.{webhook-timestamp}.{raw body}`. Keys are `whsec_` followed by the base64 of the
 * key bytes. A request is accepted when any entry matches any of this server's keys, so a key
 * can be rotated without a moment where the two sides disagree (docs/security.md, "Signed calls
 * to tool services").
 *
 * Refused (401, before the body is parsed or a function runs): a request without the three
 * headers, a timestamp more than {@link TOLERANCE_SECONDS} from this process's clock either
 * way, no entry matching any key, and a `webhook-id` already accepted within the tolerance
 * window. That last check is an in-memory cache of at most `maxRemembered` ids per process:
 * after a restart (or on another process) a captured request could be replayed once more, but
 * only until its timestamp leaves the window, 5 minutes at most; a dispatch or compensate
 * replayed so is still answered from the idempotency store under its `Idempotency-Key`.
 *
 * The HMAC itself is the `standardwebhooks` library's; this module adds several keys, stricter
 * header parsing, messages that say what was wrong, and the replay cache.
 */

import { randomBytes } from "node:crypto";
import type { IncomingHttpHeaders } from "node:http";

import { Webhook } from "standardwebhooks";

import { SigningKeyError } from "../errors.js";

/**
 * The variable a `ToolServer` reads its keys from when none are passed: whitespace-separated
 * `whsec_` keys.
 */
export const SIGNING_KEYS_ENV = "SLUICE_TOOL_SIGNING_KEYS";
/**
 * How far a request's timestamp may be from this process's clock, either way (the scheme's 5
 * minutes); also how long an accepted `webhook-id` is remembered.
 */
export const TOLERANCE_SECONDS = 5 * 60;
/** The shortest key accepted: the scheme asks for at least 24 random bytes. */
export const MIN_KEY_BYTES = 24;
/**
 * How many accepted ids are remembered at most (about 100 bytes each). Only requests whose
 * signature verified are remembered, so only a holder of a key can fill it; past this bound the
 * oldest accepted are forgotten first.
 */
export const MAX_REMEMBERED = 100_000;

const PREFIX = "whsec_";
const HEADERS = ["webhook-id", "webhook-timestamp", "webhook-signature"] as const;
// Standard base64 with its padding, strictly: one spelling of a key on both sides.
const BASE64 = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;
const TIMESTAMP = /^[0-9]{1,12}$/;
// One entry of webhook-signature: the version, a comma, an HMAC-SHA256 (32 bytes) in base64.
const V1_ENTRY = /^v1,[A-Za-z0-9+/]{43}=$/;
const UTF8 = new TextDecoder("utf-8", { fatal: true });

/** A request that is not a valid signed call from Sluice; the message says why (answered 401). */
export class RequestRejected extends Error {
  override name = "RequestRejected";
}

/** A fresh random key (32 bytes) as `whsec_<base64>`, for both sides' configuration. */
export function newSigningKey(): string {
  return PREFIX + randomBytes(32).toString("base64");
}

/**
 * The key bytes of `whsec_` keys.
 *
 * @throws {SigningKeyError} a malformed key, named by its position and `source`, never shown
 */
export function parseSigningKeys(keys: readonly string[], source: string): Uint8Array[] {
  return keys.map((key, index) => {
    const which = `signing key ${index + 1} of ${keys.length} (from ${source})`;
    if (typeof key !== "string" || !key.startsWith(PREFIX)) {
      throw new SigningKeyError(
        `${which} does not start with ${PREFIX}: a Standard Webhooks key is ${PREFIX} followed ` +
          "by the base64 of the key bytes",
      );
    }
    const encoded = key.slice(PREFIX.length);
    if (!BASE64.test(encoded)) {
      throw new SigningKeyError(
        `${which}: the part after ${PREFIX} is not valid base64 (standard alphabet A-Z a-z 0-9 + /, ` +
          "padded with =)",
      );
    }
    const raw = Buffer.from(encoded, "base64");
    if (raw.length < MIN_KEY_BYTES) {
      throw new SigningKeyError(
        `${which} decodes to ${raw.length} bytes; a key needs at least ${MIN_KEY_BYTES} random ` +
          "bytes (newSigningKey() makes one of 32)",
      );
    }
    return new Uint8Array(raw);
  });
}

/**
 * The `webhook-signature` Sluice sends: one `v1,` entry per key, in the keys' order,
 * space-separated (the shared vectors in sdk/test-vectors/standard-webhooks.json pin it).
 */
export function signatureHeader(keys: readonly string[], id: string, timestamp: number, body: string | Buffer): string {
  const at = new Date(timestamp * 1000);
  return parseSigningKeys(keys, "the keys given")
    .map((key) => new Webhook(key, { format: "raw" }).sign(id, at, typeof body === "string" ? body : Buffer.from(body)))
    .join(" ");
}

/**
 * Checks the Standard Webhooks headers of requests against a set of keys, and remembers the ids
 * it accepted within the tolerance window.
 */
export class SignatureVerifier {
  readonly #webhooks: Webhook[];
  readonly #maxRemembered: number;
  /** Each accepted id and when it leaves the window (unix seconds), oldest accepted first. */
  readonly #seen = new Map<string, number>();

  constructor(keys: readonly Uint8Array[], options: { maxRemembered?: number } = {}) {
    if (keys.length === 0) {
      throw new SigningKeyError("a SignatureVerifier needs at least one key");
    }
    this.#webhooks = keys.map((key) => new Webhook(key, { format: "raw" }));
    this.#maxRemembered = options.maxRemembered ?? MAX_REMEMBERED;
  }

  /** Refuses a request without the three headers, before its body is read. */
  checkHeaders(headers: IncomingHttpHeaders): void {
    const missing = HEADERS.filter((name) => !header(headers, name));
    if (missing.length > 0) {
      throw new RequestRejected(
        `unsigned request: missing ${missing.join(", ")}; every call from Sluice carries ` +
          "webhook-id, webhook-timestamp and webhook-signature (Standard Webhooks)",
      );
    }
  }

  /**
   * Accepts a signed request once.
   *
   * @param body the raw body as received
   * @throws {RequestRejected} saying what was wrong
   */
  verify(headers: IncomingHttpHeaders, body: Buffer): void {
    this.checkHeaders(headers);
    const id = header(headers, "webhook-id") ?? "";
    const stamp = (header(headers, "webhook-timestamp") ?? "").trim();
    if (!TIMESTAMP.test(stamp)) {
      throw new RequestRejected(`webhook-timestamp must be whole unix seconds, not ${JSON.stringify(stamp.slice(0, 40))}`);
    }
    const now = Math.floor(Date.now() / 1000);
    const skew = now - Number(stamp);
    if (Math.abs(skew) > TOLERANCE_SECONDS) {
      throw new RequestRejected(
        `webhook-timestamp is ${Math.abs(skew)} s ${skew > 0 ? "in the past" : "in the future"}; a request ` +
          `more than ${TOLERANCE_SECONDS} s from this service's clock is refused (a replay, or a clock that ` +
          "is off: check NTP on both sides)",
      );
    }
    // Only well-formed v1 entries go to the library, so that one unknown or garbled entry
    // cannot hide a valid one.
    const entries = (header(headers, "webhook-signature") ?? "").split(" ").filter((entry) => V1_ENTRY.test(entry));
    if (entries.length === 0) {
      throw new RequestRejected("webhook-signature holds no v1,<base64 HMAC-SHA256> entry");
    }
    let text: string;
    try {
      text = UTF8.decode(body);
    } catch {
      // Sluice sends JSON, always UTF-8; the library signs text.
      throw new RequestRejected("the body is not UTF-8: it cannot be a signed call from Sluice");
    }
    const checked = { "webhook-id": id, "webhook-timestamp": stamp, "webhook-signature": entries.join(" ") };
    if (!this.#webhooks.some((webhook) => matches(webhook, text, checked))) {
      throw new RequestRejected(
        "webhook-signature: no v1 signature matches this service's signing keys: the request was " +
          "signed with another key, or its id, timestamp or body changed after signing",
      );
    }
    this.#remember(id, Number(stamp) + TOLERANCE_SECONDS, now);
  }

  #remember(id: string, expires: number, now: number): void {
    // Ids arrive about in timestamp order, so those that left the window are at the front.
    for (const [seen, until] of this.#seen) {
      if (until >= now) {
        break;
      }
      this.#seen.delete(seen);
    }
    const until = this.#seen.get(id);
    if (until !== undefined && until >= now) {
      throw new RequestRejected(
        `webhook-id ${JSON.stringify(id.slice(0, 80))} was already accepted within the last ` +
          `${TOLERANCE_SECONDS} s: a replayed request is refused (Sluice signs each request, retries ` +
          "included, under a new id)",
      );
    }
    this.#seen.delete(id);
    if (this.#seen.size >= this.#maxRemembered) {
      for (const [seen, until] of this.#seen) {
        if (until < now) {
          this.#seen.delete(seen);
        }
      }
      for (const seen of this.#seen.keys()) {
        if (this.#seen.size < this.#maxRemembered) {
          break;
        }
        this.#seen.delete(seen);
      }
    }
    this.#seen.set(id, expires);
  }
}

function matches(webhook: Webhook, text: string, headers: Record<string, string>): boolean {
  try {
    webhook.verify(text, headers, { jsonParse: false });
    return true;
  } catch {
    return false;
  }
}

function header(headers: IncomingHttpHeaders, name: string): string | undefined {
  const value = headers[name];
  return typeof value === "string" && value !== "" ? value : undefined;
}
