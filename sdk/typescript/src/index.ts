/**
 * `@sluice/client`: agents' side effects through Sluice, from TypeScript.
 *
 * - {@link Sluice}: connect, `guard` tools (Fuze style) and `defineEffect` (Standard Agents
 *   style), each checked against the server's catalog when defined; run agents whose journal
 *   positions, and so idempotency keys, repeat when they are re-driven.
 * - {@link Run}: decisions, calls, scheduled effects, rollback.
 * - {@link SluiceClient}: the HTTP API itself, typed from schemas/openapi.yaml.
 * - Typed errors for every way an effect or a request can end badly.
 *
 * The tool side (an upstream speaking Sluice's wire contract on Node's `http`) is
 * `@sluice/client/tool-server`.
 */

export { SluiceClient } from "./client.js";
export type { ClientOptions, RetryOptions, WaitOptions } from "./client.js";
export * from "./errors.js";
export { Journal } from "./journal.js";
export type { JournalPosition } from "./journal.js";
export {
  checkRunId,
  checkToolName,
  commandKey,
  commandKeyPathSegment,
  idempotencyKey,
  isRunId,
  isToolName,
  MAX_POSITION,
  parseCommandKey,
} from "./keys.js";
export type { CommandKeyParts } from "./keys.js";
export { Run } from "./run.js";
export type { ScheduledEffect } from "./run.js";
export { Sluice } from "./sluice.js";
export type {
  AgentOptions,
  EffectDefinition,
  GuardedEffect,
  GuardOptions,
  SluiceOptions,
} from "./sluice.js";
export { isSettled, TERMINAL_STATUSES } from "./types.js";
export type {
  ApprovalLink,
  ApprovalLinkOptions,
  Command,
  EffectRequest,
  ErrorBody,
  Principal,
  Revision,
  RollbackProgress,
  RollbackStarted,
  RunEffects,
  Semantics,
  Status,
  ToolCatalog,
  ToolDescription,
} from "./types.js";
