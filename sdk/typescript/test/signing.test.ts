// The tool server serves only calls signed by Sluice (Standard Webhooks), on the wire: a real
// Node http server on loopback, requests made with fetch and signed with the `standardwebhooks`
// library. Also the keys' configuration, the credential in the printed catalog, the shared
// signature vectors, and `sluice dev` signing with the right and the wrong key.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";

import { EffectError, Sluice, SluiceError } from "@sluice/client";
import {
  newSigningKey,
  SIGNING_KEYS_ENV,
  signatureHeader,
  SigningKeyError,
  type ToolServerOptions,
  ToolServer,
} from "@sluice/client/tool-server";
import { CATALOG_HEADER, listen, REPO, SIGNING_KEY, signed, type SluiceProcess, startSluice, TOKENS } from "./harness.js";

const OLD = newSigningKey();
const NEW = newSigningKey();
const STRANGER = newSigningKey();

interface Vectors {
  signatures: { name: string; keys: string[]; webhook_id: string; webhook_timestamp: number; body: string; webhook_signature: string }[];
  invalid_keys: { why: string; key: string }[];
}
const VECTORS = JSON.parse(readFileSync(join(REPO, "sdk/test-vectors/standard-webhooks.json"), "utf8")) as Vectors;

const calls = { dispatch: 0, status: 0, compensate: 0 };
const schema = {
  type: "object",
  required: ["to", "amount"],
  properties: { to: { type: "string" }, amount: { type: "integer" } },
} as const;

/** A payout tool counting each function's runs. */
function payments(options: ToolServerOptions, counts = calls): ToolServer {
  return new ToolServer(options).define<{ to: string; amount: number }, { id: string }>({
    name: "pay/out",
    semantics: "NON_IDEMPOTENT",
    businessKey: "{to}:{amount}",
    schema,
    dispatch: async (args) => {
      counts.dispatch += 1;
      return { id: `p-${counts.dispatch}`, ...args };
    },
    statusCheck: async () => {
      counts.status += 1;
      return null;
    },
    compensate: async ({ externalRef }) => {
      counts.compensate += 1;
      return { id: `rev-${externalRef}` };
    },
  });
}

/** Runs `work` with `SLUICE_TOOL_SIGNING_KEYS` set to `value` (deleted when `undefined`). */
function withEnv<T>(value: string | undefined, work: () => T): T {
  const saved = process.env[SIGNING_KEYS_ENV];
  if (value === undefined) {
    delete process.env[SIGNING_KEYS_ENV];
  } else {
    process.env[SIGNING_KEYS_ENV] = value;
  }
  try {
    return work();
  } finally {
    if (saved === undefined) {
      delete process.env[SIGNING_KEYS_ENV];
    } else {
      process.env[SIGNING_KEYS_ENV] = saved;
    }
  }
}

let server: Awaited<ReturnType<typeof listen>>;

before(async () => {
  // Two keys, as during a rotation.
  server = await listen(payments({ signingKeys: [OLD, NEW] }).handler);
});

after(async () => {
  await server?.close();
});

const body = (n: number) => JSON.stringify({ to: `acc-${n}`, amount: n });

async function send(path: string, content = "", headers: Record<string, string> = {}, url = server.url) {
  const method = path.includes("/by-key/") ? "GET" : "POST";
  const response = await fetch(url + path, {
    method,
    headers: { "idempotency-key": `r-1/${randomUUID()}`, "content-type": "application/json", ...headers },
    ...(method === "GET" ? {} : { body: content }),
  });
  return { status: response.status, text: await response.text() };
}

/** A 401 whose JSON error says `reason`, and holds no key. */
function refused(answer: { status: number; text: string }, reason: string): void {
  assert.equal(answer.status, 401, answer.text);
  const error = (JSON.parse(answer.text) as { error: string }).error;
  assert.ok(error.includes(reason), `${JSON.stringify(error)} should say ${JSON.stringify(reason)}`);
  for (const key of [OLD, NEW, STRANGER]) {
    assert.ok(!answer.text.includes(key.slice("whsec_".length)));
  }
}

describe("verification", () => {
  test("an unsigned call is refused on every route and nothing runs", async () => {
    const before = { ...calls };
    for (const path of ["/pay/out", "/pay/out/by-key/acc-1%3A1", "/pay/out/compensate", "/no/such"]) {
      refused(await send(path, body(1)), "unsigned request: missing webhook-id, webhook-timestamp, webhook-signature");
    }
    const { "webhook-signature": _, ...unsigned } = signed(body(1), [NEW]);
    refused(await send("/pay/out", body(1), unsigned), "missing webhook-signature");
    assert.deepEqual(calls, before);
  });

  test("a call signed with another key is refused", async () => {
    const before = { ...calls };
    for (const path of ["/pay/out", "/pay/out/by-key/acc-2%3A2", "/pay/out/compensate"]) {
      const content = path.includes("/by-key/") ? "" : body(2);
      refused(await send(path, content, signed(content, [STRANGER])), "no v1 signature matches this service's signing keys");
    }
    assert.deepEqual(calls, before);
  });

  for (const [offset, when] of [[-360, "in the past"], [360, "in the future"]] as const) {
    test(`a timestamp six minutes ${when} is refused`, async () => {
      const before = { ...calls };
      const headers = signed(body(3), [NEW], { timestamp: Math.floor(Date.now() / 1000) + offset });
      refused(await send("/pay/out", body(3), headers), `s ${when}`);
      assert.deepEqual(calls, before);
    });
  }

  test("a replayed webhook-id is refused", async () => {
    const before = calls.dispatch;
    const headers = signed(body(4), [NEW]);
    assert.equal((await send("/pay/out", body(4), headers)).status, 201);
    // Byte for byte again: the idempotency store would answer it, but the replay cache refuses
    // it first; so it does on another route.
    refused(await send("/pay/out", body(4), headers), "was already accepted");
    refused(await send("/pay/out/compensate", body(4), headers), "was already accepted");
    assert.equal(calls.dispatch, before + 1);
  });

  test("a body, id or timestamp altered after signing is refused", async () => {
    const before = { ...calls };
    const headers = signed(body(5), [NEW]);
    const altered = body(5).replace('"amount":5', '"amount":500');
    assert.notEqual(altered, body(5));
    refused(await send("/pay/out", altered, headers), "no v1 signature matches");
    refused(await send("/pay/out", body(5), { ...headers, "webhook-id": `${headers["webhook-id"]}x` }), "no v1 signature matches");
    const later = String(Number(headers["webhook-timestamp"]) + 1);
    refused(await send("/pay/out", body(5), { ...headers, "webhook-timestamp": later }), "no v1 signature matches");
    assert.deepEqual(calls, before);
  });

  test("either key of a rotation is accepted", async () => {
    const before = calls.dispatch;
    assert.equal((await send("/pay/out", body(6), signed(body(6), [NEW]))).status, 201);
    assert.equal((await send("/pay/out", body(7), signed(body(7), [OLD]))).status, 201);
    // The status check ran (and found nothing).
    assert.equal((await send("/pay/out/by-key/acc-6%3A6", "", signed("", [NEW]))).status, 404);
    assert.equal(calls.dispatch, before + 2);
  });

  test("one valid entry among several is accepted; none at all is refused", async () => {
    const before = calls.dispatch;
    const headers = signed(body(8), [STRANGER, NEW]); // what Sluice sends holding a key we do not
    const [first, valid] = (headers["webhook-signature"] ?? "").split(" ");
    headers["webhook-signature"] = `v2,${valid?.slice(3)} ${first} v1a,zz garbage  ${valid}`;
    assert.equal((await send("/pay/out", body(8), headers)).status, 201);
    const none = signed(body(9), [NEW]);
    none["webhook-signature"] = `v2,${none["webhook-signature"]?.slice(3)} nonsense`;
    refused(await send("/pay/out", body(9), none), "holds no v1,<base64 HMAC-SHA256> entry");
    assert.equal(calls.dispatch, before + 1);
  });

  test("a timestamp that is not whole seconds is refused", async () => {
    refused(await send("/pay/out", body(10), { ...signed(body(10), [NEW]), "webhook-timestamp": "1e9" }), "must be whole unix seconds");
  });
});

describe("configuration", () => {
  const fails = (work: () => unknown, ...patterns: RegExp[]) =>
    assert.throws(work, (e: unknown) => e instanceof SigningKeyError && e instanceof SluiceError && patterns.every((p) => p.test(e.message)));

  test("without a key the server is not built", () => {
    withEnv(undefined, () =>
      fails(() => new ToolServer(), /SLUICE_TOOL_SIGNING_KEYS is not set/, /Set SLUICE_TOOL_SIGNING_KEYS/, /allowUnsigned: true/),
    );
    withEnv(" \n ", () => fails(() => new ToolServer(), /SLUICE_TOOL_SIGNING_KEYS is not set/));
    fails(() => new ToolServer({ signingKeys: [] }), /signingKeys is empty.*allowUnsigned: true/);
  });

  test("keys come from the variable when not passed; keys passed win", async () => {
    const counts = { dispatch: 0, status: 0, compensate: 0 };
    const tools = withEnv(`${OLD}\n  ${NEW} `, () => payments({}, counts));
    const served = await listen(tools.handler);
    try {
      assert.equal((await send("/pay/out", body(1), signed(body(1), [NEW]), served.url)).status, 201);
      refused(await send("/pay/out", body(2), {}, served.url), "unsigned request");
      refused(await send("/pay/out", body(3), signed(body(3), [STRANGER]), served.url), "no v1");
    } finally {
      await served.close();
    }
    assert.equal(counts.dispatch, 1);
    const passed = withEnv(NEW, () => payments({ signingKeys: STRANGER }, counts));
    const other = await listen(passed.handler);
    try {
      refused(await send("/pay/out", body(4), signed(body(4), [NEW]), other.url), "no v1");
    } finally {
      await other.close();
    }
  });

  test("allowUnsigned serves anyone, and says so", async () => {
    const warnings: Error[] = [];
    const onWarning = (warning: Error) => warnings.push(warning);
    process.on("warning", onWarning);
    const counts = { dispatch: 0, status: 0, compensate: 0 };
    const tools = withEnv(undefined, () => payments({ allowUnsigned: true }, counts));
    await new Promise((resolve) => setImmediate(resolve)); // warnings are emitted on the next tick
    process.off("warning", onWarning);
    assert.ok(warnings.some((w) => /anyone who can reach this server can call its tools/.test(w.message)));
    assert.equal(tools.verifiesSignatures, false);
    const served = await listen(tools.handler);
    try {
      assert.equal((await send("/pay/out", body(1), {}, served.url)).status, 201);
    } finally {
      await served.close();
    }
    assert.equal(counts.dispatch, 1);
    assert.equal(payments({ signingKeys: [NEW], allowUnsigned: true }).verifiesSignatures, true, "a key given wins");
  });

  for (const invalid of VECTORS.invalid_keys) {
    test(`a malformed key is refused without being shown: ${invalid.why}`, () => {
      const secret = invalid.key.slice("whsec_".length);
      const hidden = (e: unknown) => e instanceof SigningKeyError && (secret === "" || !e.message.includes(secret)) && !e.message.includes(NEW.slice(6));
      assert.throws(() => new ToolServer({ signingKeys: [NEW, invalid.key] }), (e: unknown) => hidden(e) && /signing key 2 of 2 \(from signingKeys\)/.test((e as Error).message));
      withEnv(invalid.key, () =>
        assert.throws(() => new ToolServer(), (e: unknown) => hidden(e) && (e as Error).message.includes(`signing key 1 of 1 (from the ${SIGNING_KEYS_ENV} environment variable)`)),
      );
    });
  }
});

describe("the shared vectors", () => {
  for (const vector of VECTORS.signatures) {
    test(vector.name, () => {
      // The library, as the tests sign; and the SDK's signer, as a tool author's tests would.
      const at = { id: vector.webhook_id, timestamp: vector.webhook_timestamp };
      assert.equal(signed(vector.body, vector.keys, at)["webhook-signature"], vector.webhook_signature);
      assert.equal(signatureHeader(vector.keys, vector.webhook_id, vector.webhook_timestamp, vector.body), vector.webhook_signature);
    });
  }
});

describe("the catalog", () => {
  test("names the credential once, before the tools, and never a key", () => {
    const tools = payments({ signingKeys: [OLD, NEW] });
    const printed = tools.catalogToml("http://tools:9000");
    assert.ok(
      printed.startsWith(
        '[credentials.tool_services]\nkind = "standard_webhooks"\nkeys = [{ env = "SLUICE_TOOL_SIGNING_KEYS" }]\n\n' +
          '[[tool]]\nname = "pay/out"\ncredential = "tool_services"\n',
      ),
      printed,
    );
    assert.equal(printed.split("[credentials.").length, 2);
    assert.ok(
      printed.includes(
        '[tool.status_check]\nurl = "http://tools:9000/pay/out/by-key/{business_key}"\nabsent_status = [404]\nduplicate_status = [409]\n',
      ),
    );
    for (const key of [OLD, NEW]) {
      assert.ok(!printed.includes(key.slice(6)));
    }
    const named = tools.catalogToml("http://t", { credential: "pay", keysEnv: "PAY_KEYS" });
    assert.ok(named.startsWith('[credentials.pay]\nkind = "standard_webhooks"\nkeys = [{ env = "PAY_KEYS" }]\n'));
    assert.ok(named.includes('credential = "pay"'));
    const filed = tools.catalogToml("http://t", { keysFile: "/etc/sluice/tool-keys" });
    assert.ok(filed.includes('keys = [{ file = "/etc/sluice/tool-keys" }]'));
    assert.throws(() => tools.catalogToml("http://t", { keysEnv: "A", keysFile: "/b" }), /not both/);
    for (const invalid of ["tool services", "Tool_services", "tool-services"]) {
      assert.throws(() => tools.catalogToml("http://t", { credential: invalid }), /Sluice takes snake_case/);
    }
    assert.throws(() => tools.catalogToml("http://t", { keysEnv: "MY-KEYS" }), /not an environment variable/);
  });

  test("an unsigned server prints no credential unless one is named", () => {
    const tools = withEnv(undefined, () => payments({ allowUnsigned: true }));
    const printed = tools.catalogToml("http://t");
    assert.ok(!printed.includes("credential"), printed);
    assert.ok(tools.catalogToml("http://t", { credential: "later" }).includes('credential = "later"'));
  });
});

// With Sluice: `sluice dev` signs every call with the keys in SLUICE_TOOL_SIGNING_KEYS.
describe("with sluice dev", () => {
  let tools: Awaited<ReturnType<typeof listen>>;
  let catalog: string;
  const counts = { dispatch: 0, status: 0, compensate: 0 };
  const note = {
    name: "shop/note",
    semantics: "IDEMPOTENT",
    schema: { type: "object", required: ["text"], properties: { text: { type: "string" } } },
  } as const;

  before(async () => {
    const server = new ToolServer({ signingKeys: [SIGNING_KEY] }).define<{ text: string }, { id: string; text: string }>({
      ...note,
      dispatch: async (args) => {
        counts.dispatch += 1;
        return { id: `n-${counts.dispatch}`, text: args.text };
      },
    });
    tools = await listen(server.handler);
    catalog = `${CATALOG_HEADER}\n${server.catalogToml(tools.url)}`;
  });

  after(async () => {
    await tools?.close();
  });

  async function withSluice<T>(keys: string[], work: (sluice: Sluice) => Promise<T>): Promise<T> {
    let running: SluiceProcess | undefined;
    try {
      running = await startSluice(catalog, {}, keys);
      return await work(await Sluice.connect({ url: running.url, token: TOKENS.agentA }));
    } finally {
      await running?.stop();
    }
  }

  test("sluice holding another key runs nothing", async () => {
    const before = counts.dispatch;
    await withSluice([STRANGER], async (sluice) => {
      const outcome = await sluice
        .run(`stranger-${randomUUID()}`)
        .call("shop/note", { text: "never sent" }, { pollSeconds: 2, timeoutMs: 10_000 })
        .then(
          (result) => ({ settled: "CONFIRMED", result }),
          (error: unknown) => ({ settled: "not confirmed", error }),
        );
      assert.equal(outcome.settled, "not confirmed", JSON.stringify(outcome));
      assert.ok("error" in outcome && outcome.error instanceof EffectError, String(outcome));
    });
    assert.equal(counts.dispatch, before);
  });

  test("sluice mid-rotation signs with both keys, and one matches", async () => {
    const before = counts.dispatch;
    await withSluice([STRANGER, SIGNING_KEY], async (sluice) => {
      const effect = await sluice.run(`rotated-${randomUUID()}`).call("shop/note", { text: "rotated" });
      assert.deepEqual((effect as { text: string }).text, "rotated");
    });
    assert.equal(counts.dispatch, before + 1);
  });
});
