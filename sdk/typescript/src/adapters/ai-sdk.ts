/**
 * `@sluice/client/ai-sdk`: Sluice catalog tools for the Vercel AI SDK (`ai`, tested with
 * 7.0.173; a peer dependency), each execution a Sluice effect at its journal position in a
 * Sluice run. Approval uses the SDK's own mechanism: `toolApproval` on `generateText` /
 * `streamText` / `ToolLoopAgent` answers `user-approval` for a call Sluice holds BLOCKED, so the
 * result carries a `tool-approval-request` part and nothing ran upstream.
 *
 * ```ts
 * const sluice = await Sluice.connect();
 * const tools = new SluiceAiTools(sluice, sluice.run("order-42"));
 * const messages: ModelMessage[] = [{ role: "user", content: "refund order 42" }];
 * let result = await generateText({ model, ...tools.toolSet(), messages, stopWhen: isStepCount(5) });
 * messages.push(...result.responseMessages);
 * // Sluice holds a call for a person's approval: wait for the person's decision in Sluice.
 * const { responses } = await tools.approvals(result.content, { timeoutMs: 600_000 });
 * messages.push({ role: "tool", content: responses });
 * result = await generateText({ model, ...tools.toolSet(), messages, stopWhen: isStepCount(5) });
 * ```
 *
 * {@link SluiceAiTools.approvals} answers each approval request from Sluice's decision, which
 * is the one that counts (a person with an approver's token: `sluice approve`); an application
 * that answers a request itself with `approved: false` should call
 * {@link SluiceAiTools.reject} to remove the BLOCKED effect from Sluice too. An execution the
 * application approved without Sluice's approval waits for it up to `approvalWaitMs`, then tells
 * the model it still waits. Continue with the same `SluiceAiTools` (its tool call ids hold their
 * journal positions); in a new process, re-run the agent from the start with the same run id.
 */

import { jsonSchema, type Tool, type ToolApprovalResponse, type ToolApprovalStatus, tool } from "ai";

import type { Run } from "../run.js";
import type { Sluice } from "../sluice.js";
import { isSettled, type ToolDescription } from "../types.js";
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

/** What an approval function of `toolApproval` is given by the SDK (the parts used here). */
type ApprovalOptions = { toolCallId: string };
/** A per-tool approval function, as `toolApproval` takes it. */
export type SluiceApproval = (input: unknown, options: ApprovalOptions) => Promise<ToolApprovalStatus>;

/** The catalog's tools as AI SDK tools whose executions are effects of `run`. */
export class SluiceAiTools {
  readonly calls: ToolCalls;

  constructor(sluice: Sluice, run: Run, options: AdapterOptions = {}) {
    this.calls = new ToolCalls(sluice, run, options);
  }

  /**
   * `{ tools, toolApproval }` for `generateText`, `streamText` or `ToolLoopAgent`: every tool of
   * the catalog, or those named, keyed by their model-facing names (`shop__refund`).
   */
  toolSet(...names: string[]): { tools: Record<string, Tool>; toolApproval: Record<string, SluiceApproval> } {
    const tools: Record<string, Tool> = {};
    const toolApproval: Record<string, SluiceApproval> = {};
    for (const described of this.calls.tools(names)) {
      const name = frameworkName(described.name);
      tools[name] = this.tool(described);
      if (mayNeedApproval(described)) {
        toolApproval[name] = (input, { toolCallId }) => this.#approval(described, input, toolCallId);
      }
    }
    return { tools, toolApproval };
  }

  /** One catalog tool as an AI SDK tool (without approval: see {@link toolSet}). */
  tool(described: ToolDescription): Tool {
    return tool({
      description: describeTool(described),
      // Sluice validates the arguments against the catalog's own schema.
      inputSchema: jsonSchema<Record<string, unknown>>({ type: "object", ...described.args_schema } as never),
      execute: async (input: Record<string, unknown>, { toolCallId }: ApprovalOptions) => {
        let command = this.calls.effect(toolCallId) ?? (await this.calls.submit(described, input, toolCallId));
        if (command.status === "BLOCKED") {
          // The application approved the call: Sluice's approval is still what runs it.
          command = await this.calls.waitForPeople(toolCallId, command, this.calls.options.approvalWaitMs ?? 0);
        } else if (!isSettled(command.status)) {
          // Approved in Sluice and now running: waited for as any call is.
          command = await this.calls.waitForPeople(toolCallId, command, 0);
        }
        return modelOutput(command);
      },
    }) as Tool;
  }

  async #approval(described: ToolDescription, input: unknown, toolCallId: string): Promise<ToolApprovalStatus> {
    // Asked before the call executes: the effect is recorded now, and Sluice's policy says
    // whether it waits for a person.
    const command = await this.calls.submit(described, input as Record<string, unknown>, toolCallId);
    if (command.status !== "BLOCKED") {
      return undefined;
    }
    return { type: "user-approval", reason: `Sluice holds ${command.command_key} for a person's approval` };
  }

  /** The Sluice effect behind a tool call, if one of these tools made it. */
  pending(toolCallId: string): Pending | undefined {
    const command = this.calls.effect(toolCallId);
    return command === undefined ? undefined : pendingOf(command);
  }

  /**
   * Waits up to `timeoutMs` for Sluice's decision on each `tool-approval-request` part of
   * `content` (a result's) made by these tools, and answers it as Sluice decided: the
   * `tool-approval-response`s for a `{ role: "tool" }` message, and those still waiting.
   */
  async approvals(
    content: readonly unknown[],
    { timeoutMs = 0 }: { timeoutMs?: number } = {},
  ): Promise<{ responses: ToolApprovalResponse[]; waiting: Pending[] }> {
    const responses: ToolApprovalResponse[] = [];
    const waiting: Pending[] = [];
    for (const part of content) {
      const request = part as { type?: string; approvalId?: string; isAutomatic?: boolean; toolCall?: { toolCallId: string } };
      if (request.type !== "tool-approval-request" || request.isAutomatic || request.toolCall === undefined) {
        continue;
      }
      const callId = request.toolCall.toolCallId;
      const known = this.calls.effect(callId);
      if (known === undefined || request.approvalId === undefined) {
        continue;
      }
      const command = await this.calls.waitForPeople(callId, known, timeoutMs);
      if (command.status === "BLOCKED") {
        waiting.push(pendingOf(command));
        continue;
      }
      // CANCELLED: rejected by a person, or its approval expired; it never ran. Anything else
      // was approved, and the execution returns its outcome.
      const approved = command.status !== "CANCELLED";
      responses.push({
        type: "tool-approval-response",
        approvalId: request.approvalId,
        approved,
        reason: approved
          ? `approved in Sluice (${command.command_key})`
          : `${command.tool} was not run: it is ${command.status} in Sluice (${command.last_error ?? "rejected in Sluice"})`,
      });
    }
    return { responses, waiting };
  }

  /** Removes the BLOCKED effect of a tool call the application denied (`reason` goes to the audit chain). */
  async reject(toolCallId: string, reason: string): Promise<void> {
    const known = this.calls.effect(toolCallId);
    if (known !== undefined) {
      await this.calls.remove(toolCallId, known, reason);
    }
  }
}
