/**
 * What a tool author declares for one tool, the checks made when it is declared (the same
 * rules the server's catalog applies at load, plus the ones only the tool's author can
 * answer), and the catalog TOML entry that points Sluice at it.
 *
 * A definition that Sluice could not run safely is refused here, before the server starts:
 * above all a NON_IDEMPOTENT dispatch with none of business key, status check or compensate,
 * whose every ambiguous outcome could only be left to a person.
 */

import { DefinitionError } from "../errors.js";
import { checkToolName } from "../keys.js";
import type { Semantics } from "../types.js";

/** The headers of the call, as the wire contract sends them. */
export interface CallContext {
  /** The command's idempotency key (`<run_id>/<command key>`). */
  idempotencyKey: string;
  runId: string | undefined;
  commandKey: string | undefined;
  /** The command's business key, when its tool declares one. */
  businessKey: string | undefined;
  /** On a compensate call: the idempotency key of the dispatch being undone. */
  dispatchIdempotencyKey: string | undefined;
}

/** What a compensate call carries: the effect's arguments and the commit to undo. */
export interface CompensateRequest<Args> {
  args: Args;
  /** The reference of the commit to undo (the command's own, or an extra commit's). */
  externalRef: string | null;
}

/** A JSON value, as the catalog's TOML can hold it. */
export type JsonValue =
  | string
  | number
  | boolean
  | readonly JsonValue[]
  | { readonly [key: string]: JsonValue };

/** The `[tool.policy]` keys of the catalog (deploy/catalog.toml documents each). */
export interface CatalogPolicy {
  requires_approval?: boolean;
  approve_above?: { field: string; value: number };
  max_attempts?: number;
  timeout_ms?: number;
  max_checks?: number;
  max_replays?: number;
  settle_ms?: number;
  on_absent?: "redispatch" | "fail";
  lease_ttl_ms?: number;
  verify_after_commit?: boolean;
  late_commit_ms?: number;
  verify_after_ms?: number;
  approval_timeout_ms?: number;
}

/**
 * One tool: its declaration for the catalog and the plain async functions that do its work.
 *
 * Results are JSON; a result's `id` field (a non-empty string or a number) is its external
 * reference, which Sluice records and gives back to `compensate` (the catalog's default
 * `reference_pointer = "/id"`).
 */
export interface ToolDefinition<Args extends Record<string, unknown>, Result> {
  /** `namespace/name`, each snake_case. */
  name: string;
  description?: string;
  semantics: Semantics;
  /** The JSON Schema of the arguments (`type: "object"`); Sluice validates every submission. */
  schema: { readonly [key: string]: JsonValue };
  /**
   * The template of the key the effect is known by (`"{account}:{amount_minor}:{date}"`),
   * over required argument fields. Sluice keeps one command per business key, and
   * `statusCheck` finds effects by it.
   */
  businessKey?: string;
  /**
   * Does the work, once per idempotency key: a replay gets the stored answer. Throw a
   * {@link ToolRefusal} for a definite "no" (the effect is FAILED, and the refusal is stored
   * too); any other error answers 500, is not stored, and leaves the outcome to Sluice's
   * reconciliation.
   */
  dispatch: (args: Args, call: CallContext) => Promise<Result>;
  /**
   * Finds the effects committed under a business key: none (`null` or `[]`), one, or several
   * (a duplicate, which Sluice compensates). Needs `businessKey`. A thrown error answers 503:
   * inconclusive, asked again later.
   */
  statusCheck?: (businessKey: string, call: CallContext) => Promise<Result | Result[] | null>;
  /**
   * Undoes a committed effect, once per compensation key. Throw a {@link ToolRefusal} when it
   * cannot be undone (the command is escalated to a person); any other error is retried.
   */
  compensate?: (request: CompensateRequest<Args>, call: CallContext) => Promise<unknown>;
  /** The catalog's `[tool.policy]` for the tool. */
  policy?: CatalogPolicy;
  /**
   * Accept a NON_IDEMPOTENT tool with none of business key, status check and compensate
   * (`allow_unsafe` in the catalog): every ambiguous outcome goes to a person.
   */
  allowUnsafe?: boolean;
}

/** A definite refusal from a tool function: answered with `status` (4xx) and stored. */
export class ToolRefusal extends Error {
  override name = "ToolRefusal";
  readonly status: number;
  constructor(message: string, status = 422) {
    super(message);
    if (!Number.isInteger(status) || status < 400 || status > 499 || [408, 409, 425, 429].includes(status)) {
      throw new RangeError(
        `a refusal is a 4xx other than 408, 409, 425 and 429 (those mean "not now" or "in ` +
          `progress" to Sluice), not ${status}`,
      );
    }
    this.status = status;
  }
}

/** The paths a tool is served at, below the server's base URL. */
export function toolPaths(name: string): { dispatch: string; statusCheck: string; compensate: string } {
  return {
    dispatch: `/${name}`,
    statusCheck: `/${name}/by-key/{business_key}`,
    compensate: `/${name}/compensate`,
  };
}

/** Refuses a definition Sluice could not run safely, or whose catalog entry would not load. */
export function checkDefinition<Args extends Record<string, unknown>, Result>(
  tool: ToolDefinition<Args, Result>,
): void {
  const refuse = (message: string): never => {
    throw new DefinitionError(tool.name, `tool ${tool.name}: ${message}`);
  };
  try {
    checkToolName(tool.name);
  } catch (error) {
    refuse((error as Error).message);
  }
  if (tool.schema["type"] !== "object") {
    refuse('schema must have type "object" at the top level: the arguments are a JSON object');
  }
  const required = Array.isArray(tool.schema["required"]) ? tool.schema["required"] : [];
  for (const [, field] of (tool.businessKey ?? "").matchAll(/\{([^{}]*)\}/g)) {
    if (!required.includes(field ?? "")) {
      refuse(
        `businessKey names {${field}}, which the schema does not list in required: an effect ` +
          "without it would have no business key",
      );
    }
  }
  if (tool.statusCheck && tool.businessKey === undefined) {
    refuse(
      "statusCheck looks effects up by business key, and no businessKey is declared: declare " +
        'the template of the key the upstream knows an effect by, e.g. businessKey: "{order_id}"',
    );
  }
  if (tool.semantics === "OBSERVE_ONLY" && tool.compensate) {
    refuse("an OBSERVE_ONLY tool only reads, so it has nothing to compensate: drop compensate");
  }
  const resolvable = tool.businessKey !== undefined || tool.statusCheck || tool.compensate;
  if (tool.semantics === "NON_IDEMPOTENT" && !resolvable && !tool.allowUnsafe) {
    refuse(
      "NON_IDEMPOTENT with none of businessKey, statusCheck or compensate: after a timeout or " +
        "a 5xx Sluice could neither look the effect up nor undo it, so every ambiguous call " +
        "would be STUCK for a person. Give it a businessKey and a statusCheck that finds " +
        "effects by it (best), or a compensate; or make dispatch honour the idempotency key " +
        "and declare it IDEMPOTENT; or, after review, set allowUnsafe: true",
    );
  }
  if (tool.policy?.verify_after_commit && !tool.statusCheck) {
    refuse("policy.verify_after_commit looks each commit up again, which needs a statusCheck");
  }
}

/** The credential the printed catalog names when the caller names none. */
export const DEFAULT_CREDENTIAL = "tool_services";

/**
 * The catalog's `[credentials.<name>]` table: Sluice signs the calls of the tools naming it with
 * the `whsec_` keys (whitespace-separated) in the variable `env` or the file `file`. It names
 * where the keys are, never their values.
 */
export function credentialTable(name: string, source: { env: string } | { file: string }): string {
  // Sluice refuses a credential name that is not snake_case (as a tool name's segments).
  if (!/^[a-z][a-z0-9_]{0,63}$/.test(name)) {
    throw new TypeError(
      `credential name ${JSON.stringify(name)}: Sluice takes snake_case (a lowercase letter, then lowercase ` +
        "letters, digits and _; at most 64 characters)",
    );
  }
  if ("env" in source && !/^[A-Za-z_][A-Za-z0-9_]*$/.test(source.env)) {
    throw new TypeError(`keysEnv ${JSON.stringify(source.env)} is not an environment variable's name`);
  }
  return [`[credentials.${name}]`, 'kind = "standard_webhooks"', `keys = [${tomlValue(source)}]`, ""].join("\n");
}

/**
 * The catalog TOML entry (`[[tool]]` and its tables) of `tool` served at `baseUrl`, whose calls
 * Sluice signs with `credential` (see {@link credentialTable}).
 */
export function catalogEntry<Args extends Record<string, unknown>, Result>(
  tool: ToolDefinition<Args, Result>,
  baseUrl: string,
  credential?: string,
): string {
  const base = baseUrl.replace(/\/+$/, "");
  const paths = toolPaths(tool.name);
  const lines = ["[[tool]]", `name = ${tomlValue(tool.name)}`];
  if (credential !== undefined) {
    lines.push(`credential = ${tomlValue(credential)}`);
  }
  if (tool.description !== undefined) {
    lines.push(`description = ${tomlValue(tool.description)}`);
  }
  lines.push(`semantics = ${tomlValue(tool.semantics)}`);
  if (tool.businessKey !== undefined) {
    lines.push(`business_key = ${tomlValue(tool.businessKey)}`);
  }
  if (tool.allowUnsafe) {
    lines.push("allow_unsafe = true");
  }
  lines.push(`schema = ${tomlValue(tool.schema)}`);
  const policy = Object.entries(tool.policy ?? {}).filter(([, value]) => value !== undefined);
  if (policy.length > 0) {
    lines.push("", "[tool.policy]");
    for (const [key, value] of policy) {
      lines.push(`${key} = ${tomlValue(value as JsonValue)}`);
    }
  }
  // A replay that arrives while the first request with its key still runs is answered 409:
  // Sluice must read that as "in progress" (ambiguous), not as a refusal.
  lines.push("", "[tool.dispatch]", `url = ${tomlValue(base + paths.dispatch)}`, "in_progress_status = [409]");
  if (tool.statusCheck) {
    // Sluice reads a status code as absent or duplicate only when declared: a 404 from a proxy
    // in front of a wrong URL must not pass for "never happened".
    lines.push(
      "",
      "[tool.status_check]",
      `url = ${tomlValue(base + paths.statusCheck)}`,
      "absent_status = [404]",
      "duplicate_status = [409]",
    );
  }
  if (tool.compensate) {
    lines.push("", "[tool.compensate]", `url = ${tomlValue(base + paths.compensate)}`);
  }
  return `${lines.join("\n")}\n`;
}

/** A JSON value as a TOML value: strings as basic strings, objects as inline tables. */
function tomlValue(value: JsonValue): string {
  if (typeof value === "string") {
    // A JSON string literal is a TOML basic string: the same quotes and escapes.
    return JSON.stringify(value);
  }
  if (typeof value === "number") {
    if (!Number.isFinite(value)) {
      throw new TypeError(`${value} has no TOML spelling`);
    }
    return String(value);
  }
  if (typeof value === "boolean") {
    return String(value);
  }
  if (Array.isArray(value)) {
    return `[${value.map(tomlValue).join(", ")}]`;
  }
  const entries = Object.entries(value).map(([key, item]) => `${tomlKey(key)} = ${tomlValue(item)}`);
  return entries.length === 0 ? "{}" : `{ ${entries.join(", ")} }`;
}

function tomlKey(key: string): string {
  return /^[A-Za-z0-9_-]+$/.test(key) ? key : JSON.stringify(key);
}
