/**
 * Run ids, tool names, command keys and idempotency keys, spelled exactly as the server spells
 * them (docs/architecture.md, "Vocabulary"; checked against sdk/test-vectors/journal.json).
 *
 * A command key is the journal position `d-<decision>/<namespace>/<name>/<call_idx>`; the
 * idempotency key is `<run_id>/<command key>`. Neither depends on the arguments, so an agent
 * re-driven from the start produces the same keys.
 */

/** A run id: 1–128 of `[A-Za-z0-9._:-]`. */
const RUN_ID = /^[A-Za-z0-9._:-]{1,128}$/;
/** `namespace/name`, each snake_case, at most 64 characters. */
const TOOL_NAME = /^[a-z][a-z0-9_]{0,63}\/[a-z][a-z0-9_]{0,63}$/;
const COMMAND_KEY = /^d-(0|[1-9][0-9]*)\/([a-z][a-z0-9_]{0,63}\/[a-z][a-z0-9_]{0,63})\/(0|[1-9][0-9]*)$/;

/** The largest decision or call index the server accepts (an unsigned 32-bit integer). */
export const MAX_POSITION = 4_294_967_295;

/** A journal position's parts, as the server's command key holds them. */
export interface CommandKeyParts {
  decision: number;
  tool: string;
  callIdx: number;
}

/** Whether `runId` is a run id the server accepts. */
export function isRunId(runId: string): boolean {
  return RUN_ID.test(runId);
}

/** Whether `tool` is a full `namespace/name` tool name. */
export function isToolName(tool: string): boolean {
  return TOOL_NAME.test(tool);
}

/** Throws a `TypeError` naming the rule unless `runId` is a valid run id. */
export function checkRunId(runId: string): string {
  if (!isRunId(runId)) {
    throw new TypeError(
      `invalid run id ${JSON.stringify(runId)}: a run id is 1 to 128 of A-Z a-z 0-9 . _ : -`,
    );
  }
  return runId;
}

/** Throws a `TypeError` naming the rule unless `tool` is a full `namespace/name`. */
export function checkToolName(tool: string): string {
  if (!isToolName(tool)) {
    throw new TypeError(
      `invalid tool name ${JSON.stringify(tool)}: a tool is namespace/name, each part snake_case ` +
        "starting with a letter, at most 64 characters",
    );
  }
  return tool;
}

function checkPosition(what: string, value: number): number {
  if (!Number.isInteger(value) || value < 0 || value > MAX_POSITION) {
    throw new RangeError(`${what} must be an integer from 0 to ${MAX_POSITION}, not ${value}`);
  }
  return value;
}

/** The command key of a journal position: `d-<decision>/<tool>/<callIdx>`. */
export function commandKey(decision: number, tool: string, callIdx: number): string {
  checkPosition("decision", decision);
  checkToolName(tool);
  checkPosition("call index", callIdx);
  return `d-${decision}/${tool}/${callIdx}`;
}

/** The parts of a command key, or `undefined` when the server would refuse it. */
export function parseCommandKey(key: string): CommandKeyParts | undefined {
  const match = COMMAND_KEY.exec(key);
  if (match === null) {
    return undefined;
  }
  const [, decision = "", tool = "", callIdx = ""] = match;
  const parts = { decision: Number(decision), tool, callIdx: Number(callIdx) };
  return parts.decision <= MAX_POSITION && parts.callIdx <= MAX_POSITION ? parts : undefined;
}

/** The idempotency key every call of the command carries: `<runId>/<commandKey>`. */
export function idempotencyKey(runId: string, key: string): string {
  return `${checkRunId(runId)}/${key}`;
}

/**
 * A command key as one URL path segment (`d-3%2Fpayments%2Fwire%2F0`): the server routes
 * `…/effects/{command_key}` on a single segment, so every `/` (and `%`) must be encoded.
 */
export function commandKeyPathSegment(key: string): string {
  return encodeURIComponent(key);
}
