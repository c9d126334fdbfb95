/**
 * What the agent-framework adapters share (`@sluice/client/openai-agents`,
 * `@sluice/client/ai-sdk`): a framework's tool calls as Sluice effects.
 *
 * A framework names each tool call its model makes (the Agents SDK's `callId`, the AI SDK's
 * `toolCallId`). {@link ToolCalls} gives each call id one journal position of the run, taken
 * synchronously the first time the call is seen: a call the framework asks about again (an
 * approval policy evaluated again on resume, the approved call executed) keeps its key, and the
 * ledger answers with the effect it already recorded. An agent re-run from the start (a fresh
 * `ToolCalls` on the same run id, the same calls in the same order) walks the same positions
 * and gets the stored results, whatever ids the framework gives the calls this time.
 *
 * Who approves: Sluice's approval is given by a person whose token may approve (`sluice
 * approve`, the console). The adapters never turn a framework-side approval into one; they wait
 * on Sluice's (docs/decisions.md, "Agent framework adapters").
 */

import type { WaitOptions } from "../client.js";
import { effectError } from "../errors.js";
import type { JournalPosition } from "../journal.js";
import type { Run } from "../run.js";
import type { Sluice } from "../sluice.js";
import type { Command, ToolDescription } from "../types.js";

/** Options of an adapter. */
export interface AdapterOptions {
  /** How each call waits for its effect to settle (the `Sluice`'s defaults otherwise). */
  wait?: WaitOptions;
  /**
   * How long a call the application approved in the framework waits for Sluice's approval
   * (default 0: it tells the model it still waits).
   */
  approvalWaitMs?: number;
}

/** An effect Sluice holds BLOCKED for a person's approval: what an interruption carries. */
export interface Pending {
  runId: string;
  commandKey: string;
  idempotencyKey: string;
  tool: string;
  args: Record<string, unknown>;
  status: Command["status"];
  /** The console command lines a person with an approver's token runs. */
  remedy: string;
}

/** The name a framework's model calls `tool` by: `shop/refund` → `shop__refund`. */
export function frameworkName(tool: string): string {
  return tool.replaceAll("/", "__");
}

/** Whether the catalog's policy can hold a call of `tool` for a person's approval. */
export function mayNeedApproval(tool: ToolDescription): boolean {
  return tool.requires_approval || tool.approve_above !== null;
}

/** The tool's description for a model, saying when a call waits for approval. */
export function describeTool(tool: ToolDescription): string {
  const text = tool.description || tool.name;
  if (tool.requires_approval) {
    return `${text} (each call waits for a person's approval)`;
  }
  if (tool.approve_above !== null) {
    return `${text} (a call with ${tool.approve_above.field} above ${tool.approve_above.value} waits for approval)`;
  }
  return text;
}

/** The pending effect of a BLOCKED command. */
export function pendingOf(command: Command): Pending {
  return {
    runId: command.run_id,
    commandKey: command.command_key,
    idempotencyKey: command.idempotency_key,
    tool: command.tool,
    args: command.args,
    status: command.status,
    remedy: effectError(command)?.remedy ?? "",
  };
}

/** What the model is told of a command: the upstream's answer once CONFIRMED, else what happened. */
export function modelOutput(command: Command): unknown {
  if (command.status === "CONFIRMED") {
    return command.result;
  }
  if (command.status === "BLOCKED") {
    return {
      status: command.status,
      command_key: command.command_key,
      message: "this call waits for a person's approval in Sluice; nothing ran yet",
      remedy: pendingOf(command).remedy,
    };
  }
  const error = effectError(command);
  return { error: command.status, message: error?.message ?? `${command.tool} is ${command.status}` };
}

/** One Sluice run's tool calls, one journal position per framework call id. */
export class ToolCalls {
  readonly sluice: Sluice;
  readonly run: Run;
  readonly options: AdapterOptions;
  readonly #positions = new Map<string, JournalPosition>();
  readonly #effects = new Map<string, Command>();

  constructor(sluice: Sluice, run: Run, options: AdapterOptions = {}) {
    this.sluice = sluice;
    this.run = run;
    this.options = options;
  }

  /** The catalog's tools: all, or those named (`namespace/name`, or bare in the default one). */
  tools(names: readonly string[]): ToolDescription[] {
    if (names.length === 0) {
      return [...this.sluice.tools];
    }
    return names.map((name) => {
      const found = this.sluice.tool(name);
      if (found === undefined) {
        const known = this.sluice.tools.map((tool) => tool.name).join(", ") || "none";
        throw new RangeError(`the server's catalog has no tool ${JSON.stringify(name)} (known: ${known})`);
      }
      return found;
    });
  }

  /** The latest state seen of the effect of call `callId`. */
  effect(callId: string): Command | undefined {
    return this.#effects.get(callId);
  }

  /**
   * Records call `callId` of `tool` at its journal position (taken now, synchronously) and
   * waits for it to settle; BLOCKED is settled and returned as it is. Refusals throw.
   */
  async submit(tool: ToolDescription, args: Record<string, unknown>, callId: string | undefined): Promise<Command> {
    let position = callId === undefined ? undefined : this.#positions.get(callId);
    if (position === undefined) {
      position = this.run.journal.next(tool.name);
      if (callId !== undefined) {
        this.#positions.set(callId, position);
      }
    }
    const command = await this.sluice.client.submit(
      { run_id: this.run.id, decision: position.decision, tool: position.tool, call_idx: position.callIdx, args },
      this.options.wait ?? {},
    );
    return this.#seen(callId, command);
  }

  /**
   * Waits up to `ms` for a person's decision on a BLOCKED effect, then for the effect to
   * settle; returns it as it then stands (still BLOCKED when nobody decided).
   */
  async waitForPeople(callId: string | undefined, command: Command, ms: number): Promise<Command> {
    const deadline = Date.now() + ms;
    let now = command;
    while (now.status === "BLOCKED" && Date.now() < deadline) {
      await new Promise((resolve) => setTimeout(resolve, Math.min(250, Math.max(deadline - Date.now(), 0))));
      now = await this.sluice.client.getEffect(now.run_id, now.command_key);
    }
    if (now.status !== "BLOCKED") {
      now = await this.sluice.client.waitForEffect(now.run_id, now.command_key, this.options.wait ?? {});
    }
    return this.#seen(callId, now);
  }

  /** Removes a BLOCKED effect (an agent may cancel its own effect that has not run). */
  async remove(callId: string, command: Command, reason: string): Promise<Command> {
    const removed = await this.sluice.client.removeEffect(command.run_id, command.command_key, reason);
    return this.#seen(callId, removed.command);
  }

  #seen(callId: string | undefined, command: Command): Command {
    if (callId !== undefined) {
      this.#effects.set(callId, command);
    }
    return command;
  }
}
