/**
 * Every error the SDK throws, typed so an agent can tell "the API refused the request" from
 * "the effect ended badly" from "this definition is unsafe", and so a person reading a log
 * knows which command it is about and what to do next.
 *
 * - {@link ApiError} and its subclasses: the server refused a request (401, 403, 404, 409,
 *   422, 503 after retries); nothing about the effect changed.
 * - {@link EffectError} and its subclasses: the effect was recorded and settled somewhere other
 *   than CONFIRMED (FAILED, STUCK, BLOCKED, CANCELLED, rolled back), or is still moving when the
 *   client stopped waiting. Each carries the run id, command key, status, the command and a
 *   `remedy`: what a person can do.
 * - {@link DefinitionError}: a guard, effect or tool definition refused before anything runs.
 * - {@link SigningKeyError}: a tool server's signing keys are missing or malformed.
 */

import type { Command, ErrorBody, Status } from "./types.js";

/** The base of every error this package throws. */
export class SluiceError extends Error {
  override name = "SluiceError";
}

/** What the server said, and to which request. */
export interface ApiErrorInit {
  status: number;
  method: string;
  path: string;
  body: ErrorBody | undefined;
}

/** The server answered a request with an error; `code` is its machine-readable reason. */
export class ApiError extends SluiceError {
  override name = "ApiError";
  /** The HTTP status. */
  readonly status: number;
  /** The error code of the body (`argument_drift`, `unknown_tool`, …), or `http_<status>`. */
  readonly code: string;
  /** The body's `details`: for 422, the violations with their JSON pointers. */
  readonly details: unknown;
  readonly method: string;
  readonly path: string;
  /** The error body as the server sent it. */
  readonly body: ErrorBody | undefined;

  constructor(init: ApiErrorInit, hint?: string) {
    const code = init.body?.code ?? `http_${init.status}`;
    const message = init.body?.message ?? "no error body";
    super(`${init.method} ${init.path}: ${init.status} ${code}: ${message}${hint ? `. ${hint}` : ""}`);
    this.status = init.status;
    this.code = code;
    this.details = init.body?.details;
    this.method = init.method;
    this.path = init.path;
    this.body = init.body;
  }
}

/** 401: no token, or one the server does not know. */
export class UnauthenticatedError extends ApiError {
  override name = "UnauthenticatedError";
  constructor(init: ApiErrorInit) {
    super(init, "Pass the token `sluice dev` printed (SLUICE_TOKEN) or one from [[auth.tokens]]");
  }
}

/** 403: the token's role may not do this, or the run belongs to another agent. */
export class ForbiddenError extends ApiError {
  override name = "ForbiddenError";
}

/** 404: an unknown tool, run or command. */
export class NotFoundError extends ApiError {
  override name = "NotFoundError";
}

/** One argument the server refused, by JSON pointer. */
export interface Violation {
  pointer: string;
  message: string;
}

/** 422: invalid ids or arguments; nothing was recorded. */
export class InvalidRequestError extends ApiError {
  override name = "InvalidRequestError";

  /** The violations the server named, when it named any (`/args/amount_minor`, …). */
  get violations(): Violation[] {
    const listed = Array.isArray(this.details)
      ? this.details
      : isRecord(this.details) && Array.isArray(this.details["violations"])
        ? this.details["violations"]
        : [];
    return listed.filter(
      (v): v is Violation =>
        isRecord(v) && typeof v["pointer"] === "string" && typeof v["message"] === "string",
    );
  }
}

/** 409 other than drift or a rolled-back run (e.g. `business_key_held`). */
export class ConflictError extends ApiError {
  override name = "ConflictError";
}

/**
 * 429 `tenant_over_quota`: the tenant already holds its whole quota of effects in flight.
 * Nothing was recorded: submit the same effect again after `retryAfterS` seconds.
 */
export class OverQuotaError extends ApiError {
  override name = "OverQuotaError";
  /** The tenant refused, its quota and what it had in flight, as the server counted them. */
  readonly tenant: string | undefined;
  readonly quota: number | undefined;
  readonly inFlight: number | undefined;
  /** Seconds to wait before submitting again. */
  readonly retryAfterS: number | undefined;

  constructor(init: ApiErrorInit) {
    super(init, "Nothing was recorded: submit the same effect again after Retry-After");
    const details = isRecord(init.body?.details) ? init.body.details : {};
    const text = (v: unknown) => (typeof v === "string" ? v : undefined);
    const num = (v: unknown) => (typeof v === "number" ? v : undefined);
    this.tenant = text(details["tenant"]);
    this.quota = num(details["quota"]);
    this.inFlight = num(details["in_flight"]);
    this.retryAfterS = num(details["retry_after_s"]);
  }
}

/**
 * 409 `budget_exceeded`: the effect's amount would pass a spend budget whose `on_exceed` is
 * `deny`; nothing was recorded (for an approver's edit: nothing changed). The budget, its limit,
 * what its counter had spent and this amount, in the currency's minor units.
 */
export class BudgetExceededError extends ConflictError {
  override name = "BudgetExceededError";
  readonly budget: string | undefined;
  readonly currency: string | undefined;
  readonly limit: number | undefined;
  /** What the budget's counter held already (`used`). */
  readonly spent: number | undefined;
  /** This effect's amount. */
  readonly amount: number | undefined;

  constructor(init: ApiErrorInit) {
    super(init);
    const details = isRecord(init.body?.details) ? init.body.details : {};
    const text = (v: unknown) => (typeof v === "string" ? v : undefined);
    const num = (v: unknown) => (typeof v === "number" ? v : undefined);
    this.budget = text(details["budget"]);
    this.currency = text(details["currency"]);
    this.limit = num(details["limit"]);
    this.spent = num(details["used"]);
    this.amount = num(details["amount"]);
  }
}

/** 503 (`ledger_unavailable`, `dispatch_backlog_full`) still answered after every retry. */
export class UnavailableError extends ApiError {
  override name = "UnavailableError";
}

/** A journal position that was recorded with other arguments (409 `argument_drift`). */
export class ArgumentDriftError extends ConflictError {
  override name = "ArgumentDriftError";
  readonly runId: string;
  readonly commandKey: string;
  /** The stored command's status, when it could be read. */
  readonly commandStatus: Status | undefined;
  /** The arguments stored under the key, when they could be read. */
  readonly storedArgs: Record<string, unknown> | undefined;
  /** The arguments this call sent. */
  readonly args: Record<string, unknown>;
  readonly remedy =
    "The agent produced other arguments at a journal position it had already used, so it is " +
    "not deterministic up to this call. Make a re-driven agent repeat its earlier arguments, " +
    "or open a new decision (run.decide()) for a new intent; the recorded effect stands.";

  constructor(
    init: ApiErrorInit,
    position: { runId: string; commandKey: string; args: Record<string, unknown> },
    stored: Command | undefined,
  ) {
    super(init);
    this.runId = position.runId;
    this.commandKey = position.commandKey;
    this.args = position.args;
    this.commandStatus = stored?.status;
    this.storedArgs = stored?.args;
    this.message += `. ${this.remedy}`;
  }
}

/** A new effect in a run that was rolled back (409 `run_rolled_back`): nothing was recorded. */
export class RunRolledBackError extends ConflictError {
  override name = "RunRolledBackError";
  readonly runId: string;
  /** The position the refused effect would have taken. */
  readonly commandKey: string;
  readonly remedy =
    "A rolled-back run takes no new effects (its existing ones still answer). Start a new run.";

  constructor(init: ApiErrorInit, position: { runId: string; commandKey: string }) {
    super(init);
    this.runId = position.runId;
    this.commandKey = position.commandKey;
    this.message += `. ${this.remedy}`;
  }
}

/** An effect that was recorded and did not end CONFIRMED. */
export abstract class EffectError extends SluiceError {
  override name = "EffectError";
  readonly runId: string;
  readonly commandKey: string;
  readonly idempotencyKey: string;
  readonly status: Status;
  /** The command as the server last answered it. */
  readonly command: Command;
  /** What a person (or the agent) can do about it. */
  readonly remedy: string;

  protected constructor(command: Command, what: string, remedy: string) {
    super(
      `${command.tool} at ${command.run_id}/${command.command_key} is ${command.status}: ${what}. ${remedy}`,
    );
    this.runId = command.run_id;
    this.commandKey = command.command_key;
    this.idempotencyKey = command.idempotency_key;
    this.status = command.status;
    this.command = command;
    this.remedy = remedy;
  }
}

/** FAILED: the upstream refused the effect, or it was decided absent. Nothing is committed. */
export class EffectFailedError extends EffectError {
  override name = "EffectFailedError";
  constructor(command: Command) {
    super(
      command,
      command.last_error ?? "the upstream refused it",
      `Fix the cause, then an admin may replay it: sluice replay ${command.run_id} ` +
        `${command.command_key} --reason "…"; a re-driven agent then gets the new outcome`,
    );
  }
}

/** STUCK: the outcome is unknown and no evidence can decide it; a person must. */
export class EffectStuckError extends EffectError {
  override name = "EffectStuckError";
  constructor(command: Command) {
    super(
      command,
      `its outcome is unknown${command.last_error ? ` (${command.last_error})` : ""} and Sluice ` +
        "will not retry it blindly",
      `A person checks the upstream for idempotency key ${command.idempotency_key}, then ` +
        `settles it: sluice resolve ${command.run_id} ${command.command_key} --outcome ` +
        `confirmed|failed --evidence … --reason "…" (or sluice replay … --evidence … if it did ` +
        "not commit); a re-driven agent then gets that outcome",
    );
  }
}

/** BLOCKED: the effect waits for a person's approval (policy `requires_approval`, `approve_above`). */
export class ApprovalRequiredError extends EffectError {
  override name = "ApprovalRequiredError";
  constructor(command: Command) {
    super(
      command,
      "it awaits a person's approval",
      `An admin approves it (sluice approve ${command.run_id} ${command.command_key} --reason ` +
        `"…") or rejects it (sluice reject …); re-drive the agent in the same run to get the result`,
    );
  }
}

/**
 * CANCELLED: rejected, removed before it ran, or never approved in time. It will not run.
 * `rejection` says who rejected it and why, when a person did.
 */
export class EffectCancelledError extends EffectError {
  override name = "EffectCancelledError";
  readonly rejection: Command["rejection"];
  constructor(command: Command) {
    const rejection = command.rejection;
    super(
      command,
      rejection
        ? `${rejection.by} rejected it: ${rejection.reason}`
        : (command.last_error ?? "it was cancelled before it ran"),
      rejection
        ? "It will not run. Change what the person objected to and ask again in a new decision (run.decide()), or leave it"
        : "It will not run. If it is still wanted, ask for it again in a new decision (run.decide())",
    );
    this.rejection = rejection;
  }
}

/** Rolled back: COMPENSATING, COMPENSATED, NO_COMPENSATION or COMPENSATION_FAILED. */
export class EffectRolledBackError extends EffectError {
  override name = "EffectRolledBackError";
  constructor(command: Command) {
    const undone: Partial<Record<Status, string>> = {
      COMPENSATING: "its run was rolled back and it is being undone",
      COMPENSATED: "its run was rolled back and it was undone",
      NO_COMPENSATION: "its run was rolled back and the tool cannot undo it",
      COMPENSATION_FAILED: "its run was rolled back and undoing it failed",
    };
    const byHand = command.status === "NO_COMPENSATION" || command.status === "COMPENSATION_FAILED";
    super(
      command,
      undone[command.status] ?? "its run was rolled back",
      byHand
        ? `A person must undo it by hand (external ref ${command.external_ref ?? "unknown"}); ` +
            "the run takes no new effects: start a new run"
        : "The run takes no new effects: start a new run",
    );
  }
}

/** Still moving (PENDING, LEASED, UNKNOWN, …) when the client stopped waiting. */
export class EffectTimeoutError extends EffectError {
  override name = "EffectTimeoutError";
  constructor(command: Command, waitedMs: number) {
    super(
      command,
      `still in flight after ${waitedMs} ms of waiting`,
      `Nothing is lost: wait again with run.wait("${command.command_key}"), or re-drive the ` +
        "agent later (the same position returns the same command)",
    );
  }
}

/** The error for a settled command that is not CONFIRMED; `undefined` for CONFIRMED. */
export function effectError(command: Command): EffectError | undefined {
  switch (command.status) {
    case "CONFIRMED":
      return undefined;
    case "FAILED":
      return new EffectFailedError(command);
    case "STUCK":
      return new EffectStuckError(command);
    case "BLOCKED":
      return new ApprovalRequiredError(command);
    case "CANCELLED":
      return new EffectCancelledError(command);
    case "COMPENSATING":
    case "COMPENSATED":
    case "NO_COMPENSATION":
    case "COMPENSATION_FAILED":
      return new EffectRolledBackError(command);
    case "SCHEDULED":
    case "PENDING":
    case "APPROVED":
    case "LEASED":
    case "UNKNOWN":
      return undefined;
  }
}

/** A guard, effect or tool definition that is refused before anything runs. */
export class DefinitionError extends SluiceError {
  override name = "DefinitionError";
  /** The tool the definition names. */
  readonly tool: string;
  constructor(tool: string, message: string) {
    super(message);
    this.tool = tool;
  }
}

/**
 * The tool server's signing keys are missing or malformed (thrown when a `ToolServer` is
 * built). The message names a key by its position and where it came from, never by its value.
 */
export class SigningKeyError extends SluiceError {
  override name = "SigningKeyError";
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}
