// The tool-side handler over real HTTP on loopback, as Sluice's connector calls it (signed):
// replays answered from the idempotency-key store, status by business key, compensate, and the
// definitions it refuses. Signature checks themselves: signing.test.ts.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { DefinitionError, ToolRefusal, ToolServer } from "@sluice/client/tool-server";
import { listen, SIGNING_KEY, signed } from "./harness.js";

interface Order {
  id: string;
  sku: string;
  qty: number;
  cancelled: boolean;
}

const orders: Order[] = [];
const calls = { dispatch: 0, compensate: 0, flaky: 0 };
let release: () => void = () => undefined;
let server: Awaited<ReturnType<typeof listen>>;

const schema = {
  type: "object",
  required: ["sku", "qty"],
  properties: { sku: { type: "string" }, qty: { type: "integer" } },
} as const;

/** A server verifying the tests' key. */
const keyed = () => new ToolServer({ signingKeys: [SIGNING_KEY] });

before(async () => {
  const tools = keyed()
    .define<{ sku: string; qty: number; slow?: boolean }, Order>({
      name: "shop/order",
      semantics: "NON_IDEMPOTENT",
      businessKey: "{sku}:{qty}",
      schema,
      dispatch: async (args) => {
        calls.dispatch += 1;
        if (args.qty > 100) {
          throw new ToolRefusal("not that many in stock");
        }
        if (args.slow) {
          await new Promise<void>((resolve) => (release = resolve));
        }
        const order = { id: `o-${orders.length + 1}`, sku: args.sku, qty: args.qty, cancelled: false };
        orders.push(order);
        return order;
      },
      statusCheck: async (businessKey) => {
        if (businessKey === "broken:1") {
          throw new Error("the order database is down");
        }
        return orders.filter((o) => !o.cancelled && `${o.sku}:${o.qty}` === businessKey);
      },
      compensate: async ({ externalRef }) => {
        calls.compensate += 1;
        const order = orders.find((o) => o.id === externalRef);
        if (order === undefined) {
          throw new ToolRefusal(`no order ${externalRef}`, 404);
        }
        order.cancelled = true;
        return { id: `cancel-${order.id}` };
      },
    })
    .define<{ n: number }, { id: string }>({
      name: "shop/flaky",
      semantics: "IDEMPOTENT",
      schema: { type: "object", required: ["n"], properties: { n: { type: "integer" } } },
      dispatch: async (args) => {
        calls.flaky += 1;
        if (calls.flaky === 1) {
          throw new Error("connection to the warehouse reset");
        }
        return { id: `f-${args.n}` };
      },
    });
  server = await listen(tools.handler);
});

after(async () => {
  await server?.close();
});

async function call(method: string, path: string, key: string | undefined, body?: unknown) {
  const content = body === undefined ? "" : JSON.stringify(body);
  const headers: Record<string, string> = { "content-type": "application/json", "x-sluice-run-id": "r-1", ...signed(content) };
  if (key !== undefined) {
    headers["idempotency-key"] = key;
  }
  const response = await fetch(server.url + path, {
    method,
    headers,
    ...(body === undefined ? {} : { body: content }),
  });
  return { status: response.status, body: (await response.json()) as Record<string, unknown> };
}

describe("dispatch", () => {
  test("a replay of the key gets the stored answer and runs nothing", async () => {
    const first = await call("POST", "/shop/order", "r-1/d-1/shop/order/0", { sku: "a", qty: 1 });
    assert.equal(first.status, 201);
    const replay = await call("POST", "/shop/order", "r-1/d-1/shop/order/0", { qty: 1, sku: "a" });
    assert.deepEqual(replay, first);
    assert.equal(calls.dispatch, 1);
    assert.equal(orders.length, 1);
  });

  test("the key with other arguments is refused (422), a replay in progress answered 409", async () => {
    const other = await call("POST", "/shop/order", "r-1/d-1/shop/order/0", { sku: "a", qty: 2 });
    assert.equal(other.status, 422);
    const slow = call("POST", "/shop/order", "r-1/d-2/shop/order/0", { sku: "s", qty: 1, slow: true });
    await new Promise((resolve) => setTimeout(resolve, 50));
    const during = await call("POST", "/shop/order", "r-1/d-2/shop/order/0", { sku: "s", qty: 1, slow: true });
    assert.equal(during.status, 409, "in progress: Sluice reads it as ambiguous (in_progress_status)");
    release();
    assert.equal((await slow).status, 201);
    assert.equal(orders.filter((o) => o.sku === "s").length, 1);
  });

  test("a refusal is stored like a result; a crash is not, so the retry runs", async () => {
    const before = calls.dispatch;
    const refused = await call("POST", "/shop/order", "r-1/d-3/shop/order/0", { sku: "b", qty: 500 });
    assert.equal(refused.status, 422);
    assert.deepEqual(await call("POST", "/shop/order", "r-1/d-3/shop/order/0", { sku: "b", qty: 500 }), refused);
    assert.equal(calls.dispatch, before + 1);

    const crashed = await call("POST", "/shop/flaky", "r-1/d-1/shop/flaky/0", { n: 7 });
    assert.equal(crashed.status, 500);
    const retried = await call("POST", "/shop/flaky", "r-1/d-1/shop/flaky/0", { n: 7 });
    assert.deepEqual(retried, { status: 201, body: { id: "f-7" } });
    assert.equal(calls.flaky, 2);
  });

  test("a call without Idempotency-Key is refused", async () => {
    assert.equal((await call("POST", "/shop/order", undefined, { sku: "c", qty: 1 })).status, 400);
    assert.equal((await call("POST", "/shop/nothing", "k", { sku: "c", qty: 1 })).status, 404);
  });
});

describe("status by business key", () => {
  test("absent 404, present 200, several 409 with every reference, failing lookup 503", async () => {
    const by = (key: string) => call("GET", `/shop/order/by-key/${encodeURIComponent(key)}`, "r-1/d-9/shop/order/0");
    assert.equal((await by("zzz:1")).status, 404);
    const present = await by("a:1");
    assert.equal(present.status, 200);
    assert.equal(present.body["id"], "o-1");
    // The same order booked again under another key: a duplicate Sluice must clean up.
    assert.equal((await call("POST", "/shop/order", "r-2/d-1/shop/order/0", { sku: "a", qty: 1 })).status, 201);
    const duplicate = await by("a:1");
    assert.equal(duplicate.status, 409);
    assert.deepEqual(duplicate.body["refs"], ["o-1", orders.at(-1)?.id]);
    assert.equal(duplicate.body["id"], "o-1");
    assert.equal((await by("broken:1")).status, 503, "inconclusive, asked again later");
  });
});

describe("compensate", () => {
  test("undoes once per compensation key; replays get the stored answer; the impossible is a 4xx", async () => {
    const key = "r-1/d-1/shop/order/0/compensate";
    const body = { args: { sku: "a", qty: 1 }, external_ref: "o-1" };
    const first = await call("POST", "/shop/order/compensate", key, body);
    assert.deepEqual(first, { status: 200, body: { id: "cancel-o-1" } });
    assert.deepEqual(await call("POST", "/shop/order/compensate", key, body), first);
    assert.equal(calls.compensate, 1);
    assert.equal(orders.find((o) => o.id === "o-1")?.cancelled, true);
    const missing = await call("POST", "/shop/order/compensate", "r-9/d-1/shop/order/0/compensate", { args: { sku: "x", qty: 1 }, external_ref: "o-404" });
    assert.equal(missing.status, 404);
  });
});

describe("definitions", () => {
  const base = { schema, dispatch: async () => ({ id: "x" }) };
  const refused = (tool: Parameters<ToolServer["define"]>[0], pattern: RegExp) =>
    assert.throws(() => keyed().define(tool), (e: unknown) => e instanceof DefinitionError && pattern.test(e.message));

  test("a NON_IDEMPOTENT dispatch with no business key, status check or compensate is refused", () => {
    refused({ ...base, name: "pay/send", semantics: "NON_IDEMPOTENT" }, /none of businessKey, statusCheck or compensate.*allowUnsafe/);
    assert.doesNotThrow(() => keyed().define({ ...base, name: "pay/send", semantics: "NON_IDEMPOTENT", allowUnsafe: true }));
  });

  test("other definitions the catalog could not load are refused", () => {
    refused({ ...base, name: "pay/look", semantics: "NON_IDEMPOTENT", statusCheck: async () => null }, /statusCheck looks effects up by business key/);
    refused({ ...base, name: "pay/read", semantics: "OBSERVE_ONLY", compensate: async () => null }, /nothing to compensate/);
    refused({ ...base, name: "pay/key", semantics: "IDEMPOTENT", businessKey: "{note}" }, /\{note\}.*required/);
    refused({ ...base, name: "Pay/Send", semantics: "IDEMPOTENT" }, /invalid tool name/);
    refused({ ...base, name: "pay/send", semantics: "IDEMPOTENT", schema: { type: "array" } }, /type "object"/);
    const tools = keyed().define({ ...base, name: "pay/send", semantics: "IDEMPOTENT" });
    assert.throws(() => tools.define({ ...base, name: "pay/send", semantics: "IDEMPOTENT" }), /already defined/);
    assert.throws(() => new ToolRefusal("in progress", 409), RangeError);
  });

  test("catalogToml prints each tool's catalog entry", () => {
    const tools = keyed().define({
      ...base,
      name: "pay/send",
      description: 'Pay "someone"',
      semantics: "NON_IDEMPOTENT",
      businessKey: "{sku}:{qty}",
      statusCheck: async () => null,
      compensate: async () => null,
      policy: { approve_above: { field: "qty", value: 10 }, max_attempts: 2 },
    });
    assert.equal(
      tools.catalogToml("http://127.0.0.1:9/"),
      `[credentials.tool_services]
kind = "standard_webhooks"
keys = [{ env = "SLUICE_TOOL_SIGNING_KEYS" }]

[[tool]]
name = "pay/send"
credential = "tool_services"
description = "Pay \\"someone\\""
semantics = "NON_IDEMPOTENT"
business_key = "{sku}:{qty}"
schema = { type = "object", required = ["sku", "qty"], properties = { sku = { type = "string" }, qty = { type = "integer" } } }

[tool.policy]
approve_above = { field = "qty", value = 10 }
max_attempts = 2

[tool.dispatch]
url = "http://127.0.0.1:9/pay/send"
in_progress_status = [409]

[tool.status_check]
url = "http://127.0.0.1:9/pay/send/by-key/{business_key}"
absent_status = [404]
duplicate_status = [409]

[tool.compensate]
url = "http://127.0.0.1:9/pay/send/compensate"
`,
    );
  });
});
