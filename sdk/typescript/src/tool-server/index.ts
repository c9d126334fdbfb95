/**
 * `@sluice/client/tool-server`: the tool side of Sluice. Turns plain async functions into an
 * upstream that speaks Sluice's wire contract on Node's `http` — dispatch answered once per
 * idempotency key, status by business key, compensate — refuses at definition time what
 * Sluice could not run safely, and prints the catalog entries that point Sluice at it.
 */

export {
  type CallContext,
  type CatalogPolicy,
  type CompensateRequest,
  type JsonValue,
  type ToolDefinition,
  ToolRefusal,
  toolPaths,
} from "./definition.js";
export { DefinitionError } from "../errors.js";
export { type ToolServerOptions, ToolServer } from "./server.js";
export {
  fingerprint,
  type IdempotencyStore,
  MemoryStore,
  type StoredAnswer,
  type StoredEntry,
} from "./store.js";
