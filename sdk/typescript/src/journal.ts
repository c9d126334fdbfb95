/**
 * The journal: where an agent is in its run, as sdk/test-vectors/journal.json defines it.
 *
 * A journal starts in decision 1. `decide()` opens the next decision and restarts every tool's
 * call index at 0; each call of a tool takes that tool's next call index in the current
 * decision. Positions depend only on the order of decisions and calls, never on arguments or
 * time, so an agent re-driven from the start walks the same positions, produces the same
 * idempotency keys and gets the stored results back instead of new effects.
 */

import { checkToolName, commandKey, MAX_POSITION } from "./keys.js";

/** One position in the journal. */
export interface JournalPosition {
  decision: number;
  tool: string;
  callIdx: number;
  /** `d-<decision>/<tool>/<callIdx>`. */
  commandKey: string;
}

/** A run's journal position: the current decision and each tool's next call index in it. */
export class Journal {
  #decision = 1;
  readonly #calls = new Map<string, number>();

  /** The current decision (1 for a fresh journal). */
  get decision(): number {
    return this.#decision;
  }

  /** Opens the next decision; every tool's call index starts again at 0. */
  decide(): number {
    if (this.#decision >= MAX_POSITION) {
      throw new RangeError(`the journal is at the last decision the server accepts (${MAX_POSITION})`);
    }
    this.#decision += 1;
    this.#calls.clear();
    return this.#decision;
  }

  /** Takes the next position of `tool` (a full `namespace/name`) in the current decision. */
  next(tool: string): JournalPosition {
    checkToolName(tool);
    const callIdx = this.#calls.get(tool) ?? 0;
    const position = {
      decision: this.#decision,
      tool,
      callIdx,
      commandKey: commandKey(this.#decision, tool, callIdx),
    };
    this.#calls.set(tool, callIdx + 1);
    return position;
  }
}
