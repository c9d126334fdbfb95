/**
 * The API's shapes under readable names, all taken from the types generated from
 * schemas/openapi.yaml (src/generated/openapi.ts), so a change to the document shows up here
 * as a type error rather than as a surprise at run time.
 */

import type { components, operations } from "./generated/openapi.js";

type Schemas = components["schemas"];

/** A command: the durable record of one intended effect. */
export type Command = Schemas["Command"];
/** An approver's edit of a command's arguments, made as they approved it. */
export type Revision = Schemas["Revision"];
/** A command's status. */
export type Status = Schemas["Status"];
/** What re-calling a tool does to the world. */
export type Semantics = Schemas["ToolDescription"]["semantics"];
/** A tool as the server describes it to agents (`GET /v1/tools`). */
export type ToolDescription = Schemas["ToolDescription"];
/** The body of `POST /v1/effects`. */
export type EffectRequest = Schemas["EffectRequest"];
/** The error body every error answer carries. */
export type ErrorBody = Schemas["ErrorBody"];
/** Where a run's rollback stands, per command, in compensation order. */
export type RollbackProgress = Schemas["RollbackProgress"];
/** The caller as the server sees its token. */
export type Principal = Schemas["Principal"];

/** The answer of `GET /v1/tools`. */
export type ToolCatalog =
  operations["listTools"]["responses"]["200"]["content"]["application/json"];
/** The answer of `POST /v1/runs/{run_id}/rollback`: begun (202), or rolled back before with
 * nothing written (200, `already_rolled_back`). */
export type RollbackStarted =
  | operations["rollback"]["responses"]["202"]["content"]["application/json"]
  | operations["rollback"]["responses"]["200"]["content"]["application/json"];
/** The answer of `POST …/effects/{command_key}:approval-link`: the URL is the credential. */
export type ApprovalLink =
  operations["createApprovalLink"]["responses"]["201"]["content"]["application/json"];
/** What an approval link is made with: seconds it lives (60..604800), and whom it is for. */
export interface ApprovalLinkOptions {
  expiresInS?: number;
  for?: string;
}
/** A run's effects (`GET /v1/runs/{run_id}/effects` and `…/scheduled`). */
export type RunEffects =
  operations["listRunEffects"]["responses"]["200"]["content"]["application/json"];

/** Statuses after which nothing more happens to a command without a person. */
export const TERMINAL_STATUSES: ReadonlySet<Status> = new Set<Status>([
  "CONFIRMED",
  "FAILED",
  "CANCELLED",
  "COMPENSATED",
  "NO_COMPENSATION",
  "COMPENSATION_FAILED",
]);

/** Statuses a long poll returns on: terminal, or waiting for a person (STUCK, BLOCKED). */
export function isSettled(status: Status): boolean {
  return TERMINAL_STATUSES.has(status) || status === "STUCK" || status === "BLOCKED";
}
