/**
 * `@sluice/client/openai-agents`: Sluice catalog tools as tools of the OpenAI Agents SDK
 * (`@openai/agents`, tested with 0.20.0; a peer dependency), each invocation a Sluice effect at
 * its journal position in a Sluice run.
 *
 * ```ts
 * const sluice = await Sluice.connect();
 * const run = sluice.run("order-42");
 * const tools = new SluiceAgentTools(sluice, run);
 * const agent = new Agent({ name: "support", tools: tools.tools() });   // or tools.tools("shop/refund")
 * let result = await runAgent(agent, "refund order 42");
 * while (result.interruptions.length > 0) {            // Sluice holds a call for a person's approval
 *   await tools.settle(result.state, { timeoutMs: 600_000 });  // the person decides in Sluice
 *   result = await runAgent(agent, result.state);
 * }
 * ```
 *
 * A call the catalog's policy may hold for approval (`requires_approval`, `approve_above`) is
 * recorded when the SDK asks the tool's `needsApproval`: if Sluice holds it BLOCKED, the run
 * stops with the SDK's own interruption (`result.interruptions`) and nothing ran upstream;
 * {@link SluiceAgentTools.pending} gives the Sluice effect behind an interruption (its command
 * key and the console line that approves it). The approval that counts is Sluice's, given by a
 * person with an approver's token: {@link SluiceAgentTools.settle} waits for it and mirrors it
 * into the `RunState` (approve, or reject with what Sluice recorded). A call the application
 * approves in the SDK without Sluice's approval waits for Sluice's up to `approvalWaitMs` and
 * then tells the model it still waits; one it rejects in the SDK should be rejected with
 * {@link SluiceAgentTools.reject}, which also removes the BLOCKED effect from Sluice.
 *
 * Resume a `RunState` with the same `SluiceAgentTools` (its call ids hold their positions); in a
 * new process, re-run the agent from the start with the same run id instead.
 */

import { type FunctionTool, type RunContext, type RunState, type RunToolApprovalItem, tool } from "@openai/agents";

import type { Run } from "../run.js";
import type { Sluice } from "../sluice.js";
import { type Command, isSettled, type ToolDescription } from "../types.js";
import {
  type AdapterOptions,
  describeTool,
  frameworkName,
  mayNeedApproval,
  modelOutput,
  type Pending,
  pendingOf,
  ToolCalls,
} from "./calls.js";

export type { AdapterOptions, Pending } from "./calls.js";
export { frameworkName } from "./calls.js";

// Any RunState: the adapter reads its interruptions and records decisions, whatever the agent.
type AnyRunState = RunState<any, any>;

/** The catalog's tools as Agents SDK tools whose calls are effects of `run`. */
export class SluiceAgentTools {
  readonly calls: ToolCalls;
  readonly #errors = new Map<string, unknown>();

  constructor(sluice: Sluice, run: Run, options: AdapterOptions = {}) {
    this.calls = new ToolCalls(sluice, run, options);
  }

  /** Every tool of the catalog, or those named (`namespace/name`, or bare). */
  tools(...names: string[]): FunctionTool[] {
    return this.calls.tools(names).map((described) => this.tool(described));
  }

  /** One catalog tool as an Agents SDK tool. */
  tool(described: ToolDescription): FunctionTool {
    return tool({
      name: frameworkName(described.name),
      description: describeTool(described),
      // Sluice validates the arguments against the catalog's own schema.
      parameters: { type: "object", properties: {}, required: [], additionalProperties: true, ...described.args_schema } as never,
      strict: false,
      needsApproval: mayNeedApproval(described)
        ? (_context: RunContext, input: unknown, callId?: string) => this.#needsApproval(described, input, callId)
        : false,
      execute: async (input: unknown, _context, details) =>
        JSON.stringify(await this.#execute(described, input, details?.toolCall?.callId)),
      // A refusal of the request itself (drift, a rolled-back run, 401/403) fails the run.
      errorFunction: null,
    }) as unknown as FunctionTool;
  }

  async #needsApproval(described: ToolDescription, input: unknown, callId: string | undefined): Promise<boolean> {
    // Asked before the call runs (and again when a RunState is resumed): the effect is
    // recorded now, and Sluice's policy says whether it waits for a person. A refusal is kept
    // for the execution to throw.
    try {
      const command = await this.calls.submit(described, argsOf(input), callId);
      return command.status === "BLOCKED";
    } catch (error) {
      if (callId === undefined) {
        throw error;
      }
      this.#errors.set(callId, error);
      return false;
    }
  }

  async #execute(described: ToolDescription, input: unknown, callId: string | undefined): Promise<unknown> {
    if (callId !== undefined && this.#errors.has(callId)) {
      const error = this.#errors.get(callId);
      this.#errors.delete(callId);
      throw error;
    }
    let command = (callId === undefined ? undefined : this.calls.effect(callId)) ?? (await this.calls.submit(described, argsOf(input), callId));
    if (command.status === "BLOCKED") {
      // The application let the call go on: Sluice's approval is still what runs it.
      command = await this.calls.waitForPeople(callId, command, this.calls.options.approvalWaitMs ?? 0);
    } else if (!isSettled(command.status)) {
      // Approved in Sluice and now running: waited for as any call is.
      command = await this.calls.waitForPeople(callId, command, 0);
    }
    return modelOutput(command);
  }

  /** The Sluice effect behind an interruption, if one of these tools made it. */
  pending(item: RunToolApprovalItem): Pending | undefined {
    const command = this.calls.effect(callIdOf(item));
    return command === undefined ? undefined : pendingOf(command);
  }

  /**
   * Waits up to `timeoutMs` for Sluice's decision on each of `state`'s interruptions made by
   * these tools and mirrors it: rejected, cancelled or expired in Sluice (CANCELLED) →
   * `state.reject` with what Sluice recorded; approved → `state.approve` (the execution then
   * returns the effect's outcome). Returns those still waiting.
   */
  async settle(state: AnyRunState, { timeoutMs = 0 }: { timeoutMs?: number } = {}): Promise<Pending[]> {
    const waiting: Pending[] = [];
    for (const item of state.getInterruptions()) {
      const callId = callIdOf(item);
      const known = this.calls.effect(callId);
      if (known === undefined) {
        continue;
      }
      const command = await this.calls.waitForPeople(callId, known, timeoutMs);
      if (command.status === "BLOCKED") {
        waiting.push(pendingOf(command));
      } else if (command.status === "CANCELLED") {
        // Rejected by a person, or its approval expired: it never ran.
        state.reject(item, { message: refusal(command) });
      } else {
        state.approve(item);
      }
    }
    return waiting;
  }

  /**
   * Rejects an interruption in the SDK and removes its BLOCKED effect from Sluice (`reason`
   * goes to the audit chain).
   */
  async reject(state: AnyRunState, item: RunToolApprovalItem, reason: string): Promise<void> {
    const callId = callIdOf(item);
    const known = this.calls.effect(callId);
    if (known !== undefined) {
      await this.calls.remove(callId, known, reason);
    }
    state.reject(item, { message: `rejected: ${reason}` });
  }
}

function argsOf(input: unknown): Record<string, unknown> {
  const parsed = typeof input === "string" ? (JSON.parse(input || "{}") as unknown) : input;
  if (parsed === null || typeof parsed !== "object" || Array.isArray(parsed)) {
    throw new TypeError(`a Sluice tool takes a JSON object of arguments, not ${JSON.stringify(parsed)}`);
  }
  return parsed as Record<string, unknown>;
}

function callIdOf(item: RunToolApprovalItem): string {
  const raw = item.rawItem as { callId?: string; id?: string };
  return String(raw.callId ?? raw.id);
}

function refusal(command: Command): string {
  return `${command.tool} was not run: it is ${command.status} in Sluice (${command.last_error ?? "rejected in Sluice"})`;
}
