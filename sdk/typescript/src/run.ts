/**
 * `Run`: one agent run as the agent sees it. It keeps the journal position, so every effect
 * it asks for gets the key of its position; turns settled commands into results or typed
 * errors; schedules, lists and removes effects for later; and rolls the run back.
 *
 * A position is taken synchronously when an effect is asked for, before anything is awaited:
 * effects started in a fixed order (even concurrently, `Promise.all([a(), b()])`) get the same
 * positions on every drive of the agent.
 */

import type { SluiceClient, WaitOptions } from "./client.js";
import { EffectTimeoutError, effectError, SluiceError } from "./errors.js";
import { Journal, type JournalPosition } from "./journal.js";
import { checkRunId } from "./keys.js";
import type {
  Command,
  RollbackProgress,
  RollbackStarted,
  Status,
  ToolDescription,
} from "./types.js";

/** An effect waiting for its time, as `getScheduledEffects` lists it. */
export interface ScheduledEffect {
  /** The name it was defined under (`defineEffect`), when the tool has one. */
  name: string | undefined;
  runId: string;
  commandKey: string;
  tool: string;
  args: Record<string, unknown>;
  /** When it becomes due (RFC 3339). */
  notBefore: string | undefined;
  status: Status;
}

/** What a run needs from the `Sluice` that made it. */
export interface RunContext {
  client: SluiceClient;
  wait: WaitOptions;
  /** The catalog entry of a tool, by full or bare name; throws when the catalog has none. */
  resolveTool(tool: string): ToolDescription;
  /** The tool of a defined effect, by the effect's name. */
  definedEffect(name: string): ToolDescription | undefined;
  /** The name a tool was defined under, if any. */
  effectNameOf(tool: string): string | undefined;
}

/** One agent run: its id, its journal and what it may do to its own effects. */
export class Run {
  readonly id: string;
  readonly journal = new Journal();
  readonly #context: RunContext;

  constructor(id: string, context: RunContext) {
    this.id = checkRunId(id);
    this.#context = context;
  }

  /** Opens the next decision: the agent decided something, and its next calls start at 0. */
  decide(): number {
    return this.journal.decide();
  }

  /**
   * Runs `tool` with `args` at the run's next position and returns the upstream's result once
   * the effect is CONFIRMED. Asked again at the same position (a re-driven agent), the stored
   * result comes back and nothing runs again.
   *
   * @throws {EffectError} the effect settled otherwise (FAILED, STUCK, BLOCKED, CANCELLED,
   *   rolled back) or was still moving when the wait ran out
   * @throws {ApiError} the request was refused (drift, rolled-back run, 401/403/404/422)
   */
  async call<Result = unknown>(
    tool: string,
    args: Record<string, unknown>,
    wait: WaitOptions = {},
  ): Promise<Result> {
    const command = await this.submit(tool, args, wait);
    return command.result as Result;
  }

  /** Like {@link call}, but returns the whole CONFIRMED command (keys, reference, result). */
  async submit(
    tool: string,
    args: Record<string, unknown>,
    wait: WaitOptions = {},
  ): Promise<Command> {
    const position = this.journal.next(this.#context.resolveTool(tool).name);
    return confirmed(await this.#submit(position, args, { ...this.#context.wait, ...wait }));
  }

  /**
   * Waits for an effect already recorded in this run (for instance after an
   * {@link EffectTimeoutError}) and returns its CONFIRMED command.
   */
  async wait(commandKey: string, wait: WaitOptions = {}): Promise<Command> {
    const options = { ...this.#context.wait, ...wait };
    return confirmed(await this.#context.client.waitForEffect(this.id, commandKey, options));
  }

  /**
   * Schedules the effect defined as `name` (`defineEffect`) to run `delayMs` from now, at the
   * run's next position. Returns at once; the effect runs without the agent. Scheduled again
   * at the same position (a re-driven agent), the recorded one is returned.
   */
  async scheduleEffect(
    name: string,
    args: Record<string, unknown>,
    delayMs: number,
  ): Promise<ScheduledEffect> {
    const tool = this.#context.definedEffect(name);
    if (tool === undefined) {
      throw new SluiceError(
        `no effect is defined as ${JSON.stringify(name)}: define it first with ` +
          `sluice.defineEffect(${JSON.stringify(name)}, { tool: "namespace/name", … })`,
      );
    }
    if (!Number.isInteger(delayMs) || delayMs < 0) {
      throw new RangeError(`delayMs must be a whole number of milliseconds >= 0, not ${delayMs}`);
    }
    const position = this.journal.next(tool.name);
    const command = await this.#context.client.submit(
      {
        run_id: this.id,
        decision: position.decision,
        tool: position.tool,
        call_idx: position.callIdx,
        args,
        delay_ms: delayMs,
      },
      false,
    );
    return this.#scheduled(command);
  }

  /** The run's effects still waiting for their time, earliest first. */
  async getScheduledEffects(): Promise<ScheduledEffect[]> {
    const commands = await this.#context.client.listScheduled(this.id);
    return commands.map((command) => this.#scheduled(command));
  }

  /**
   * Removes a scheduled effect before it runs (it ends CANCELLED). Returns `false` when it had
   * already started or ended, which the server does not undo.
   */
  async removeScheduledEffect(commandKey: string, reason = "removed by the agent"): Promise<boolean> {
    return (await this.#context.client.removeEffect(this.id, commandKey, reason)).removed;
  }

  /**
   * Rolls the run back: effects not started are cancelled; confirmed ones are compensated,
   * last in the journal first; those in flight are undone once their outcome is known. The
   * run then takes no new effects. Returns once the rollback is durably begun; watch it with
   * {@link watchRollback}. An agent may roll back a run whose every effect it submitted.
   */
  async rollback(reason: string): Promise<RollbackStarted> {
    return this.#context.client.rollback(this.id, reason);
  }

  /**
   * Approves one of the run's BLOCKED effects (a token that may approve: an admin's); with
   * `args`, approves it edited to those arguments, whole — a revision of the same effect (same
   * key), checked against the tool's schema, policy and budgets. Returns it APPROVED.
   */
  async approve(
    commandKey: string,
    reason: string,
    args?: Record<string, unknown>,
  ): Promise<Command> {
    return this.#context.client.approve(this.id, commandKey, reason, args);
  }

  /** Where the run's rollback stands, per command, in compensation order. */
  async rollbackProgress(): Promise<RollbackProgress> {
    return this.#context.client.rollbackProgress(this.id);
  }

  /**
   * Yields the rollback's progress every `intervalMs` (default 250) until it is done; the
   * last value yielded has `done: true`. Commands that need a person (NO_COMPENSATION,
   * COMPENSATION_FAILED, STUCK) count as done with `escalated: true`.
   */
  async *watchRollback(intervalMs = 250): AsyncGenerator<RollbackProgress, void, void> {
    for (;;) {
      const progress = await this.rollbackProgress();
      yield progress;
      if (progress.done) {
        return;
      }
      await new Promise((resolve) => setTimeout(resolve, intervalMs));
    }
  }

  /** Sends the effect at `position`, waiting as `wait` says. */
  async #submit(
    position: JournalPosition,
    args: Record<string, unknown>,
    wait: WaitOptions,
  ): Promise<Command> {
    return this.#context.client.submit(
      {
        run_id: this.id,
        decision: position.decision,
        tool: position.tool,
        call_idx: position.callIdx,
        args,
      },
      wait,
    );
  }

  #scheduled(command: Command): ScheduledEffect {
    return {
      name: this.#context.effectNameOf(command.tool),
      runId: command.run_id,
      commandKey: command.command_key,
      tool: command.tool,
      args: command.args,
      notBefore: command.not_before,
      status: command.status,
    };
  }
}

/** The command if CONFIRMED, else its typed error. */
function confirmed(command: Command): Command {
  if (command.status === "CONFIRMED") {
    return command;
  }
  // A settled command that is not CONFIRMED has an error; anything else is still moving,
  // which `submit` returns only when asked not to wait.
  throw effectError(command) ?? new EffectTimeoutError(command, 0);
}
