// The journal and key derivation against sdk/test-vectors/journal.json, the vectors the Rust
// core and the Python SDK check themselves against too.
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { Journal } from "@sluice/client";
import {
  commandKey,
  commandKeyPathSegment,
  idempotencyKey,
  isRunId,
  isToolName,
  parseCommandKey,
} from "@sluice/client";
import { vectors } from "./harness.js";

const shared = vectors();

describe("shared key vectors", () => {
  for (const v of shared.keys) {
    test(`${v.run_id} d-${v.decision} ${v.tool} #${v.call_idx}`, () => {
      const key = commandKey(v.decision, v.tool, v.call_idx);
      assert.equal(key, v.command_key);
      assert.equal(idempotencyKey(v.run_id, key), v.idempotency_key);
      assert.equal(commandKeyPathSegment(key), v.command_key_path_segment);
      assert.deepEqual(parseCommandKey(key), { decision: v.decision, tool: v.tool, callIdx: v.call_idx });
    });
  }
});

describe("shared journal vectors", () => {
  for (const v of shared.journals) {
    test(v.name, () => {
      const journal = new Journal();
      const keys: string[] = [];
      for (const step of v.steps) {
        if (step === "decide") {
          journal.decide();
        } else {
          const tool = step.replace(/^call /, "");
          assert.notEqual(tool, step, `a step is "decide" or "call <tool>", not ${step}`);
          keys.push(journal.next(tool).commandKey);
        }
      }
      assert.deepEqual(keys, v.keys);
    });
  }

  test("a journal re-driven from the start walks the same positions", () => {
    const drive = () => {
      const journal = new Journal();
      const first = journal.next("email/send").commandKey;
      journal.decide();
      return [first, journal.next("payments/wire").commandKey, journal.next("payments/wire").commandKey];
    };
    assert.deepEqual(drive(), drive());
  });
});

describe("shared invalid vectors", () => {
  test("run ids", () => {
    for (const id of shared.invalid.run_ids) {
      assert.equal(isRunId(id), false, JSON.stringify(id));
      assert.throws(() => idempotencyKey(id, "d-1/email/send/0"), TypeError);
    }
  });
  test("tool names", () => {
    for (const name of shared.invalid.tool_names) {
      assert.equal(isToolName(name), false, name);
      assert.throws(() => new Journal().next(name), TypeError);
    }
  });
  test("command keys", () => {
    for (const key of shared.invalid.command_keys) {
      assert.equal(parseCommandKey(key), undefined, key);
    }
  });
  test("positions outside 0..2^32-1", () => {
    assert.throws(() => commandKey(4294967296, "a/b", 0), RangeError);
    assert.throws(() => commandKey(1, "a/b", -1), RangeError);
    assert.throws(() => commandKey(1.5, "a/b", 0), RangeError);
  });
});
