/**
 * `@sluice/client/tool-server`: the tool side of Sluice. Turns plain async functions into an
 * upstream that speaks Sluice's wire contract on Node's `http` — dispatch answered once per
 * idempotency key, status by business key, compensate — serving only calls signed by Sluice
 * (Standard Webhooks, keys in `SLUICE_TOOL_SIGNING_KEYS`), refuses at definition time what
 * Sluice could not run safely, and prints the catalog entries that point Sluice at it.
 */

export {
  type CallContext,
  type CatalogPolicy,
  type CompensateRequest,
  DEFAULT_CREDENTIAL,
  type JsonValue,
  type ToolDefinition,
  ToolRefusal,
  toolPaths,
} from "./definition.js";
export { DefinitionError, SigningKeyError } from "../errors.js";
export { type CatalogOptions, type ToolServerOptions, ToolServer } from "./server.js";
export { newSigningKey, SIGNING_KEYS_ENV, signatureHeader } from "./signing.js";
export {
  fingerprint,
  type IdempotencyStore,
  MemoryStore,
  type StoredAnswer,
  type StoredEntry,
} from "./store.js";
