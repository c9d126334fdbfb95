/**
 * `SluiceClient`: the HTTP API of schemas/openapi.yaml on `fetch`, one method per operation an
 * agent uses, with typed answers and typed errors.
 *
 * Guarantees:
 * - Every request that meets a 503 or a connection failure is sent again with backoff (the
 *   server's `Retry-After` when it gives one). That is safe for every method here: a submission
 *   is keyed by its journal position, so a repeat answers 200 with the command already
 *   recorded, never a second effect; reads, removals and rollbacks are idempotent.
 * - Command keys travel percent-encoded as one path segment.
 * - `submit` with a wait returns only a settled command (terminal, STUCK or BLOCKED) or throws
 *   {@link EffectTimeoutError}: it uses `Prefer: wait`, and on a 202 long-polls the command
 *   (`GET …/effects/{command_key}?wait=`, the resource the answer's `Location` names).
 */

import { setTimeout as sleep } from "node:timers/promises";

import {
  ApiError,
  type ApiErrorInit,
  ArgumentDriftError,
  BudgetExceededError,
  ConflictError,
  EffectTimeoutError,
  ForbiddenError,
  InvalidRequestError,
  NotFoundError,
  OverQuotaError,
  RunRolledBackError,
  UnauthenticatedError,
  UnavailableError,
} from "./errors.js";
import { checkRunId, commandKey as formatCommandKey, commandKeyPathSegment } from "./keys.js";
import {
  type ApprovalLink,
  type ApprovalLinkOptions,
  type Command,
  type EffectRequest,
  type ErrorBody,
  isSettled,
  type Principal,
  type RollbackProgress,
  type RollbackStarted,
  type RunEffects,
  type ToolCatalog,
  type ToolDescription,
} from "./types.js";

/** How requests are retried on 503 and connection failures. */
export interface RetryOptions {
  /** Sends in all, the first included (default 8). */
  attempts?: number;
  /** The first backoff, doubled each time (default 200 ms). */
  baseDelayMs?: number;
  /** The longest backoff, and the most a `Retry-After` is honoured for (default 10 s). */
  maxDelayMs?: number;
}

/** Where the server is and who the caller is. */
export interface ClientOptions {
  /** The producer's base URL (default: `SLUICE_URL`, else `http://127.0.0.1:8700`). */
  url?: string;
  /** The bearer token (default: `SLUICE_TOKEN`; none for an API without tokens). */
  token?: string;
  /** The `fetch` to use (default: the global one). */
  fetch?: typeof fetch;
  retry?: RetryOptions;
}

/** How long to wait for an effect to settle. */
export interface WaitOptions {
  /** Seconds the server holds each answer (`Prefer: wait`, `?wait=`; default 30). */
  pollSeconds?: number;
  /** The most to wait in all before {@link EffectTimeoutError} (default 300 000 ms). */
  timeoutMs?: number;
}

const DEFAULT_URL = "http://127.0.0.1:8700";
const DEFAULT_POLL_SECONDS = 30;
const DEFAULT_TIMEOUT_MS = 300_000;

interface Answer<T> {
  status: number;
  body: T;
}

interface RequestInit {
  method: "GET" | "POST" | "DELETE";
  path: string;
  query?: Record<string, string | undefined>;
  body?: unknown;
  headers?: Record<string, string>;
  /** Statuses answered as a value rather than an error. */
  accept?: readonly number[];
}

/** A client of Sluice's HTTP API. */
export class SluiceClient {
  readonly url: string;
  readonly #token: string | undefined;
  readonly #fetch: typeof fetch;
  readonly #retry: Required<RetryOptions>;

  constructor(options: ClientOptions = {}) {
    this.url = (options.url ?? process.env["SLUICE_URL"] ?? DEFAULT_URL).replace(/\/+$/, "");
    this.#token = options.token ?? process.env["SLUICE_TOKEN"];
    this.#fetch = options.fetch ?? globalThis.fetch;
    this.#retry = {
      attempts: options.retry?.attempts ?? 8,
      baseDelayMs: options.retry?.baseDelayMs ?? 200,
      maxDelayMs: options.retry?.maxDelayMs ?? 10_000,
    };
  }

  /** The caller, as the server sees its token. */
  async whoami(): Promise<Principal> {
    return (await this.#request<Principal>({ method: "GET", path: "/v1/whoami" })).body;
  }

  /** The catalog's tools, in declaration order. */
  async listTools(): Promise<ToolCatalog> {
    return (await this.#request<ToolCatalog>({ method: "GET", path: "/v1/tools" })).body;
  }

  /** One tool, by `namespace/name` or a bare name in the default namespace. */
  async getTool(tool: string): Promise<ToolDescription> {
    const path = `/v1/tools/${encodeURIComponent(tool)}`;
    return (await this.#request<ToolDescription>({ method: "GET", path })).body;
  }

  /**
   * Records one effect and, unless `wait` is `false`, waits until it is settled (terminal,
   * STUCK or BLOCKED). Returns the command as recorded (201 new, 200 already recorded) or as
   * settled; an outcome other than CONFIRMED is returned, not thrown (see `Run` for that).
   * A command recorded before carries `existing`: `"command_key"` (this position) or
   * `"business_key"` (another command holds the tool's business key; its `run_id` and
   * `command_key` are its own, possibly another run's).
   *
   * @throws {ArgumentDriftError} the position holds other arguments
   * @throws {RunRolledBackError} the run was rolled back
   * @throws {EffectTimeoutError} still moving when `timeoutMs` ran out
   */
  async submit(effect: EffectRequest, wait: WaitOptions | false = {}): Promise<Command> {
    const position = {
      runId: effect.run_id,
      commandKey: formatCommandKey(effect.decision, effect.tool, effect.call_idx),
      args: effect.args,
    };
    const started = Date.now();
    const pollSeconds = wait === false ? 0 : (wait.pollSeconds ?? DEFAULT_POLL_SECONDS);
    let answer: Answer<Command>;
    try {
      answer = await this.#request<Command>({
        method: "POST",
        path: "/v1/effects",
        body: effect,
        headers: pollSeconds > 0 ? { prefer: `wait=${Math.ceil(pollSeconds)}` } : {},
        accept: [200, 201, 202],
      });
    } catch (error) {
      if (error instanceof ConflictError && error.code === "argument_drift") {
        const init = initOf(error);
        const stored = await this.getEffect(effect.run_id, position.commandKey).catch(() => undefined);
        throw new ArgumentDriftError(init, position, stored);
      }
      if (error instanceof ConflictError && error.code === "run_rolled_back") {
        throw new RunRolledBackError(initOf(error), position);
      }
      throw error;
    }
    // A 202 (the wait ended first) or an answer without a wait is polled until settled.
    if (wait === false || isSettled(answer.body.status)) {
      return answer.body;
    }
    const settled = await this.#poll(answer.body, started, wait);
    // How the submission found the command is said by its answer only, not by the long polls.
    const existing = answer.body.existing;
    return existing === undefined ? settled : { ...settled, existing };
  }

  /**
   * One command; with `waitSeconds` the server holds the answer until it is settled or the
   * wait ends (a long poll).
   */
  async getEffect(runId: string, commandKey: string, waitSeconds?: number): Promise<Command> {
    const path = effectPath(runId, commandKey);
    const query = { wait: waitSeconds === undefined ? undefined : `${Math.ceil(waitSeconds)}s` };
    return (await this.#request<Command>({ method: "GET", path, query })).body;
  }

  /**
   * Waits until a recorded command is settled, long-polling it.
   *
   * @throws {EffectTimeoutError} still moving when `timeoutMs` ran out
   */
  async waitForEffect(runId: string, commandKey: string, wait: WaitOptions = {}): Promise<Command> {
    const command = await this.getEffect(runId, commandKey);
    return isSettled(command.status) ? command : this.#poll(command, Date.now(), wait);
  }

  /** A run's commands in journal order, optionally only those with `status` or `tool`. */
  async listRunEffects(
    runId: string,
    filter: { status?: Command["status"]; tool?: string } = {},
  ): Promise<Command[]> {
    const path = `/v1/runs/${checkRunId(runId)}/effects`;
    return (await this.#request<RunEffects>({ method: "GET", path, query: filter })).body.effects;
  }

  /** A run's SCHEDULED effects, earliest first. */
  async listScheduled(runId: string, filter: { tool?: string } = {}): Promise<Command[]> {
    const path = `/v1/runs/${checkRunId(runId)}/scheduled`;
    return (await this.#request<RunEffects>({ method: "GET", path, query: filter })).body.effects;
  }

  /**
   * Removes an effect that has not started (SCHEDULED, PENDING, BLOCKED or APPROVED): it ends
   * CANCELLED. Returns whether it was removed, with the command and, if not, why.
   */
  async removeEffect(
    runId: string,
    commandKey: string,
    reason?: string,
  ): Promise<{ removed: boolean; command: Command; error?: ErrorBody }> {
    const answer = await this.#request<{ removed: boolean; command: Command; error?: ErrorBody }>({
      method: "DELETE",
      path: effectPath(runId, commandKey),
      query: { reason },
      accept: [200, 409],
    });
    return answer.body;
  }

  /**
   * Begins rolling the run back: effects not started are cancelled, confirmed ones compensated
   * last-first, those in flight undone once their outcome is known. An agent may roll back a
   * run whose every command it submitted.
   */
  async rollback(runId: string, reason: string): Promise<RollbackStarted> {
    const path = `/v1/runs/${checkRunId(runId)}/rollback`;
    const answer = await this.#request<RollbackStarted>({
      method: "POST",
      path,
      body: { reason },
      // 200: rolled back before, nothing written (`already_rolled_back`); rollbacks are
      // idempotent.
      accept: [200, 202],
    });
    return answer.body;
  }

  /**
   * Approves a BLOCKED command (a token that may approve: an admin's); with `args`, approves it
   * edited to those arguments, whole: a revision of the same command, checked against the
   * tool's schema, policy and budgets. Returns the command as stored (APPROVED).
   *
   * @throws {BudgetExceededError} the edited amount would pass a budget; nothing changed
   * @throws {InvalidRequestError} the edited arguments do not match the tool's schema
   * @throws {ConflictError} not BLOCKED, or policy denies the edit (`policy_denied`)
   */
  async approve(
    runId: string,
    commandKey: string,
    reason: string,
    args?: Record<string, unknown>,
  ): Promise<Command> {
    const answer = await this.#request<{ command: Command }>({
      method: "POST",
      path: `${effectPath(runId, commandKey)}:approve`,
      body: args === undefined ? { reason } : { reason, args },
    });
    return answer.body.command;
  }

  /**
   * A signed, expiring, single-use link for a person to approve or reject a BLOCKED command
   * without a login (needs an admin token). The URL is the credential: send it only to its
   * approver.
   */
  async approvalLink(
    runId: string,
    commandKey: string,
    options: ApprovalLinkOptions = {},
  ): Promise<ApprovalLink> {
    const body: { expires_in_s?: number; for?: string } = {};
    if (options.expiresInS !== undefined) body.expires_in_s = options.expiresInS;
    if (options.for !== undefined) body.for = options.for;
    const answer = await this.#request<ApprovalLink>({
      method: "POST",
      path: `${effectPath(runId, commandKey)}:approval-link`,
      body,
      accept: [201],
    });
    return answer.body;
  }

  /** Where the run's rollback stands, per command, in compensation order. */
  async rollbackProgress(runId: string): Promise<RollbackProgress> {
    const path = `/v1/runs/${checkRunId(runId)}/rollback`;
    const answer = await this.#request<{ run_id: string; progress: RollbackProgress }>({
      method: "GET",
      path,
    });
    return answer.body.progress;
  }

  /** Long-polls `command` until it is settled or `timeoutMs` (counted from `started`) ran out. */
  async #poll(command: Command, started: number, wait: WaitOptions): Promise<Command> {
    const timeoutMs = wait.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    const pollSeconds = wait.pollSeconds ?? DEFAULT_POLL_SECONDS;
    // Built from the command's keys rather than taken from `Location`, which the server
    // spells with the command key's slashes unencoded: the same resource, one segment.
    const path = effectPath(command.run_id, command.command_key);
    let current = command;
    while (!isSettled(current.status)) {
      const leftMs = timeoutMs - (Date.now() - started);
      if (leftMs <= 0) {
        throw new EffectTimeoutError(current, Date.now() - started);
      }
      const seconds = Math.max(1, Math.min(pollSeconds, Math.ceil(leftMs / 1000)));
      current = (
        await this.#request<Command>({ method: "GET", path, query: { wait: `${seconds}s` } })
      ).body;
    }
    return current;
  }

  async #request<T>(init: RequestInit): Promise<Answer<T>> {
    const url = new URL(this.url + init.path);
    for (const [name, value] of Object.entries(init.query ?? {})) {
      if (value !== undefined) {
        url.searchParams.set(name, value);
      }
    }
    const headers: Record<string, string> = { accept: "application/json", ...init.headers };
    if (this.#token) {
      headers["authorization"] = `Bearer ${this.#token}`;
    }
    if (init.body !== undefined) {
      headers["content-type"] = "application/json";
    }
    const body = init.body === undefined ? undefined : JSON.stringify(init.body);
    const accept = init.accept ?? [200];
    for (let attempt = 1; ; attempt += 1) {
      const last = attempt >= this.#retry.attempts;
      let response: Response;
      try {
        response = await this.#fetch(url, {
          method: init.method,
          headers,
          ...(body === undefined ? {} : { body }),
        });
      } catch (error) {
        // fetch rejects only when no HTTP answer came; the request may or may not have been
        // seen, which every request here tolerates (see the module comment).
        if (last) {
          throw error;
        }
        await sleep(this.#backoff(attempt, null));
        continue;
      }
      const text = await response.text();
      if (accept.includes(response.status)) {
        return { status: response.status, body: parse(text) as T };
      }
      if (response.status === 503 && !last) {
        await sleep(this.#backoff(attempt, response.headers.get("retry-after")));
        continue;
      }
      throw apiError({
        status: response.status,
        method: init.method,
        path: url.pathname,
        body: errorBody(parse(text)),
      });
    }
  }

  /** Milliseconds before attempt `attempt + 1`: `Retry-After` if given, else doubling, jittered. */
  #backoff(attempt: number, retryAfter: string | null): number {
    const { baseDelayMs, maxDelayMs } = this.#retry;
    if (retryAfter !== null) {
      const seconds = Number(retryAfter);
      const ms = Number.isFinite(seconds) ? seconds * 1000 : Date.parse(retryAfter) - Date.now();
      if (Number.isFinite(ms) && ms >= 0) {
        return Math.min(ms, maxDelayMs);
      }
    }
    const ceiling = Math.min(maxDelayMs, baseDelayMs * 2 ** (attempt - 1));
    return ceiling / 2 + Math.random() * (ceiling / 2);
  }
}

/** `/v1/runs/<run>/effects/<command key as one segment>`. */
function effectPath(runId: string, commandKey: string): string {
  return `/v1/runs/${checkRunId(runId)}/effects/${commandKeyPathSegment(commandKey)}`;
}

function parse(text: string): unknown {
  if (text === "") {
    return undefined;
  }
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return text;
  }
}

function errorBody(body: unknown): ErrorBody | undefined {
  if (typeof body === "object" && body !== null && "error" in body) {
    const error = (body as { error: unknown }).error;
    if (typeof error === "object" && error !== null && "code" in error && "message" in error) {
      return error as ErrorBody;
    }
  }
  return typeof body === "string" && body !== "" ? { code: "http_error", message: body } : undefined;
}

function apiError(init: ApiErrorInit): ApiError {
  switch (init.status) {
    case 401:
      return new UnauthenticatedError(init);
    case 403:
      return new ForbiddenError(init);
    case 404:
      return new NotFoundError(init);
    case 409:
      return init.body?.code === "budget_exceeded"
        ? new BudgetExceededError(init)
        : new ConflictError(init);
    case 422:
      return new InvalidRequestError(init);
    case 429:
      return new OverQuotaError(init);
    case 503:
      return new UnavailableError(init);
    default:
      return new ApiError(init);
  }
}

function initOf(error: ApiError): ApiErrorInit {
  return { status: error.status, method: error.method, path: error.path, body: error.body };
}
