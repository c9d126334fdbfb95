/**
 * `Sluice`: the agent-facing entry point. It loads the server's tool catalog once
 * (`GET /v1/tools`), so that `guard` and `defineEffect` check each definition against the
 * server's declaration when it is made, before any effect runs, as Fuze and Tape do; and it
 * runs agents (`agent`) with their `Run` as the current one, so guarded functions need no
 * run argument.
 *
 * ```ts
 * const sluice = await Sluice.connect();
 * const wire = sluice.guard("payments/wire", { sideEffect: true, compensate: true });
 * await sluice.agent("r-42", async (run) => {
 *   await wire({ account: "acc-1", amount_minor: 500, beneficiary: "b-9", date: "2026-11-22" });
 * }, { rollbackOnError: true });
 * ```
 */

import { AsyncLocalStorage } from "node:async_hooks";

import { type ClientOptions, SluiceClient, type WaitOptions } from "./client.js";
import { DefinitionError, SluiceError } from "./errors.js";
import { isToolName } from "./keys.js";
import { Run } from "./run.js";
import type { Semantics, ToolCatalog, ToolDescription } from "./types.js";

/** How a guarded function relies on its tool; each is checked against the catalog. */
export interface GuardOptions {
  /**
   * Whether calling the tool changes the world (default `true`). `false` says it only reads:
   * the catalog must declare it OBSERVE_ONLY, and a side effect the catalog declares is
   * refused rather than treated as a read.
   */
  sideEffect?: boolean;
  /**
   * The effect must be undone when its run is rolled back: the catalog must declare a
   * `[tool.compensate]` for the tool. (Sluice's compensator calls it, on rollback, last in the
   * journal first.)
   */
  compensate?: boolean;
  /** The semantics the caller relies on; a catalog that declares others is refused. */
  semantics?: Semantics;
  /**
   * Accept a NON_IDEMPOTENT tool that declares none of business key, status check and
   * compensate: every ambiguous outcome of it goes to a person (STUCK).
   */
  allowUnsafe?: boolean;
  /** How long each call waits for its effect to settle. */
  wait?: WaitOptions;
}

/** An async function that runs its tool through Sluice in the current run. */
export interface GuardedEffect<Args extends Record<string, unknown>, Result> {
  (args: Args): Promise<Result>;
  /** The tool as the catalog declares it. */
  readonly tool: ToolDescription;
}

/** Options of {@link Sluice.defineEffect}: a guard, and the tool if it is not the name. */
export interface EffectDefinition extends GuardOptions {
  /** The catalog tool the effect runs (default: the effect's name). */
  tool?: string;
}

/** Options of {@link Sluice.connect}. */
export interface SluiceOptions extends ClientOptions {
  /** How long effects wait to settle unless a guard or call says otherwise. */
  wait?: WaitOptions;
}

/** Options of {@link Sluice.agent}. */
export interface AgentOptions {
  /**
   * When the agent throws, roll its run back (Fuze's "the run failed, undo its side
   * effects") before the error is rethrown. The rollback's reason names the error.
   */
  rollbackOnError?: boolean;
}

const current = new AsyncLocalStorage<Run>();

/** The agent-facing client: catalog-checked definitions and runs. */
export class Sluice {
  readonly client: SluiceClient;
  readonly #wait: WaitOptions;
  #catalog: ToolCatalog;
  readonly #effects = new Map<string, ToolDescription>();

  private constructor(client: SluiceClient, catalog: ToolCatalog, wait: WaitOptions) {
    this.client = client;
    this.#catalog = catalog;
    this.#wait = wait;
  }

  /** Connects to the server (`SLUICE_URL`, `SLUICE_TOKEN` by default) and loads its catalog. */
  static async connect(options: SluiceOptions = {}): Promise<Sluice> {
    const client = new SluiceClient(options);
    return new Sluice(client, await client.listTools(), options.wait ?? {});
  }

  /** The run the calling code is in (inside {@link agent}), if any. */
  static currentRun(): Run | undefined {
    return current.getStore();
  }

  /** The catalog's tools, as loaded. */
  get tools(): readonly ToolDescription[] {
    return this.#catalog.tools;
  }

  /** Loads the catalog again (after the server's catalog changed). */
  async refreshTools(): Promise<void> {
    this.#catalog = await this.client.listTools();
  }

  /** A tool by `namespace/name` or bare name in the catalog's default namespace. */
  tool(name: string): ToolDescription | undefined {
    const full = name.includes("/") ? name : `${this.#catalog.default_namespace}/${name}`;
    return this.#catalog.tools.find((tool) => tool.name === full);
  }

  /**
   * Returns an async function that runs `tool` through Sluice in the current run: it takes
   * the run's next journal position, records the effect, waits for it, and returns the
   * upstream's result (or throws the outcome's typed error).
   *
   * @throws {DefinitionError} now, when the catalog's declaration does not carry what
   *   `options` rely on, or declares a NON_IDEMPOTENT tool with no way to resolve it
   */
  guard<Args extends Record<string, unknown> = Record<string, unknown>, Result = unknown>(
    tool: string,
    options: GuardOptions = {},
  ): GuardedEffect<Args, Result> {
    const declared = this.#check(tool, options);
    const wait = { ...this.#wait, ...options.wait };
    const guarded = async (args: Args): Promise<Result> => {
      const run = current.getStore();
      if (run === undefined) {
        throw new SluiceError(
          `${declared.name} was called outside an agent run: call it inside ` +
            "sluice.agent(runId, async (run) => …) so it gets the run's journal position",
        );
      }
      return run.call<Result>(declared.name, args, wait);
    };
    return Object.assign(guarded, { tool: declared });
  }

  /**
   * Defines an effect under `name` in the Standard Agents style: checked like {@link guard},
   * callable at once in the current run, and schedulable later with
   * `run.scheduleEffect(name, args, delayMs)`.
   */
  defineEffect<Args extends Record<string, unknown> = Record<string, unknown>, Result = unknown>(
    name: string,
    definition: EffectDefinition = {},
  ): GuardedEffect<Args, Result> {
    if (this.#effects.has(name)) {
      throw new DefinitionError(name, `an effect is already defined as ${JSON.stringify(name)}`);
    }
    const guarded = this.guard<Args, Result>(definition.tool ?? name, definition);
    this.#effects.set(name, guarded.tool);
    return guarded;
  }

  /** A handle on run `runId` (its journal starts at decision 1). */
  run(runId: string): Run {
    const effects = this.#effects;
    return new Run(runId, {
      client: this.client,
      wait: this.#wait,
      resolveTool: (tool) => this.#resolve(tool),
      definedEffect: (name) => effects.get(name),
      effectNameOf: (tool) => [...effects].find(([, declared]) => declared.name === tool)?.[0],
    });
  }

  /**
   * Runs `body` as the agent of run `runId`: guarded functions called inside it (however
   * deeply, across awaits) take positions in this run's journal. Driving the same agent again
   * with the same run id walks the same positions and gets the stored results back.
   */
  async agent<T>(runId: string, body: (run: Run) => Promise<T>, options: AgentOptions = {}): Promise<T> {
    const run = this.run(runId);
    try {
      return await current.run(run, () => body(run));
    } catch (error) {
      if (!options.rollbackOnError) {
        throw error;
      }
      const reason = `agent failed: ${error instanceof Error ? error.message : String(error)}`;
      try {
        await run.rollback(reason.slice(0, 1000));
      } catch (rollbackError) {
        throw new AggregateError(
          [error, rollbackError],
          `run ${runId} failed and its rollback could not begin; roll it back by hand: ` +
            `sluice rollback ${runId} --reason "…"`,
        );
      }
      throw error;
    }
  }

  #resolve(tool: string): ToolDescription {
    const declared = this.tool(tool);
    if (declared === undefined) {
      const known = this.#catalog.tools.map((t) => t.name).join(", ") || "none";
      throw new DefinitionError(
        tool,
        `tool ${JSON.stringify(tool)} is not in the catalog of ${this.client.url} (it has: ` +
          `${known}). Declare it in the catalog TOML (deploy/catalog.toml documents every ` +
          "field) and restart the server, or fix the name",
      );
    }
    return declared;
  }

  /** The catalog's declaration of `tool`, if it carries everything `options` rely on. */
  #check(tool: string, options: GuardOptions): ToolDescription {
    // A bare name is resolved in the catalog's default namespace.
    if (!isToolName(tool.includes("/") ? tool : `default/${tool}`)) {
      throw new DefinitionError(tool, `${JSON.stringify(tool)} is not a tool name (namespace/name)`);
    }
    const declared = this.#resolve(tool);
    const name = declared.name;
    const sideEffect = options.sideEffect ?? true;
    if (!sideEffect && declared.semantics !== "OBSERVE_ONLY") {
      throw new DefinitionError(
        name,
        `guard(${JSON.stringify(name)}, { sideEffect: false }) says it only reads, but the ` +
          `catalog declares it ${declared.semantics}: Sluice records and runs it as a side ` +
          "effect. Pass sideEffect: true, or declare it OBSERVE_ONLY in the catalog if it " +
          "truly changes nothing",
      );
    }
    if (sideEffect && declared.semantics === "OBSERVE_ONLY") {
      throw new DefinitionError(
        name,
        `guard(${JSON.stringify(name)}) treats it as a side effect, but the catalog declares ` +
          "it OBSERVE_ONLY: Sluice retries it freely and never undoes it. Pass " +
          "sideEffect: false if it only reads, or correct its semantics in the catalog",
      );
    }
    if (options.semantics !== undefined && options.semantics !== declared.semantics) {
      throw new DefinitionError(
        name,
        `guard(${JSON.stringify(name)}) relies on ${options.semantics} semantics, but the ` +
          `catalog declares ${declared.semantics}` +
          (declared.semantics === "NON_IDEMPOTENT"
            ? ": calling it again may commit twice, so Sluice never retries it without evidence. " +
              "Drop the semantics option (accepting that), or make the upstream honour " +
              "Idempotency-Key and declare it IDEMPOTENT"
            : ". Make the option match the catalog"),
      );
    }
    if (options.compensate && !declared.compensable) {
      throw new DefinitionError(
        name,
        `guard(${JSON.stringify(name)}, { compensate: true }) needs the effect undone on ` +
          "rollback, but the catalog declares no compensate for it (a rollback would end it " +
          "NO_COMPENSATION, escalated to a person). Declare [tool.compensate] with the URL " +
          "that undoes it, or drop compensate",
      );
    }
    const resolvable = declared.business_key !== null || declared.status_check || declared.compensable;
    if (declared.semantics === "NON_IDEMPOTENT" && !resolvable && !options.allowUnsafe) {
      throw new DefinitionError(
        name,
        `${name} is NON_IDEMPOTENT and the catalog declares no business_key, status_check or ` +
          "compensate for it (allow_unsafe): an ambiguous outcome (a timeout, a 5xx) could " +
          "neither be looked up nor undone, only left STUCK for a person. Declare a " +
          "[tool.status_check] (with a business_key) or a [tool.compensate] in the catalog, or " +
          "pass allowUnsafe: true if a person resolving every ambiguous call is acceptable",
      );
    }
    return declared;
  }
}
