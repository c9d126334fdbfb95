// 503 dispatch_backlog_full from a real `sluice dev` whose dispatch backlog holds one request:
// the client retries with backoff until there is room, and a client told not to retry gets the
// typed error. Resubmitting is safe because a submission is keyed by its journal position.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { SluiceClient, UnavailableError } from "@sluice/client";
import { ToolServer } from "@sluice/client/tool-server";
import { CATALOG_HEADER, listen, SIGNING_KEY, type SluiceProcess, startSluice, TOKENS } from "./harness.js";

let upstream: Awaited<ReturnType<typeof listen>>;
let server: SluiceProcess;
let calls = 0;

before(async () => {
  const tools = new ToolServer({ signingKeys: [SIGNING_KEY] }).define<{ n: number }, { id: string }>({
    name: "slow/op",
    semantics: "IDEMPOTENT",
    schema: { type: "object", required: ["n"], properties: { n: { type: "integer" } } },
    dispatch: async (args) => {
      calls += 1;
      await new Promise((resolve) => setTimeout(resolve, 400));
      return { id: `op-${args.n}` };
    },
  });
  upstream = await listen(tools.handler);
  server = await startSluice(CATALOG_HEADER + "\n" + tools.catalogToml(upstream.url), {
    bus: { admission: 1 },
    producer: { admission_wait_ms: 20 },
    dispatcher: { concurrency: 1 },
  });
});

after(async () => {
  await server?.stop();
  await upstream?.close();
});

const effect = (run: string) => ({ run_id: run, decision: 1, tool: "slow/op", call_idx: 0, args: { n: 1 } });

test("a full dispatch backlog is a typed 503 without retries, and waited out with them", async () => {
  const once = new SluiceClient({ url: server.url, token: TOKENS.agentA, retry: { attempts: 1 } });
  const answers = await Promise.allSettled([1, 2, 3, 4].map((n) => once.submit(effect(`backlog-a${n}`), false)));
  const refused = answers.filter((a) => a.status === "rejected").map((a) => (a as PromiseRejectedResult).reason as unknown);
  assert.ok(refused.length > 0, "the backlog of one filled up");
  for (const error of refused) {
    assert.ok(error instanceof UnavailableError && error.code === "dispatch_backlog_full", String(error));
  }

  // The real fetch, watched: which answers the retrying client met on its way.
  const seen: number[] = [];
  const watched: typeof fetch = async (input, init) => {
    const response = await fetch(input, init);
    seen.push(response.status);
    return response;
  };
  const patient = new SluiceClient({ url: server.url, token: TOKENS.agentA, fetch: watched, retry: { baseDelayMs: 100 } });
  const settled = await Promise.all([1, 2, 3, 4].map((n) => patient.submit(effect(`backlog-b${n}`))));
  assert.deepEqual(settled.map((c) => c.status), ["CONFIRMED", "CONFIRMED", "CONFIRMED", "CONFIRMED"]);
  assert.ok(seen.includes(503), `the retrying client met a full backlog too (answers: ${seen.join(", ")})`);
});
