// The OpenAI Agents SDK adapter (@sluice/client/openai-agents) in a real agent loop: the model is
// the SDK's own test double (`ScriptedModel` from `@openai/agents/testing`, scripted to call
// tools); the `Runner`, `sluice dev` with its ledger and the tool server are real.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { Agent, run as runAgent, setTracingDisabled } from "@openai/agents";
import { assistantMessage, functionCall, ScriptedModel } from "@openai/agents/testing";

import { Sluice } from "@sluice/client";
import { SluiceAgentTools } from "@sluice/client/openai-agents";
import { asAdmin, CATALOG_HEADER, listen, type SluiceProcess, startSluice, TOKENS } from "./harness.js";
import { tools, World } from "./world.js";

// No traces leave the test (the SDK would export them to OpenAI's API).
setTracingDisabled(true);

let world: World;
let upstream: Awaited<ReturnType<typeof listen>>;
let server: SluiceProcess;
let sluice: Sluice;

before(async () => {
  world = new World();
  const toolServer = tools(world);
  upstream = await listen(toolServer.handler);
  server = await startSluice(CATALOG_HEADER + "\n" + toolServer.catalogToml(upstream.url));
  sluice = await Sluice.connect({ url: server.url, token: TOKENS.agentA });
});

after(async () => {
  await server?.stop();
  await upstream?.close();
});

/** The SDK's test model: one tool call per turn, in order, then a last answer. */
function scripted(...calls: [string, Record<string, unknown>][]): ScriptedModel {
  return new ScriptedModel([
    ...calls.map(([name, args], i) => [functionCall(name, args, { callId: `call-${i}` })]),
    [assistantMessage("done")],
  ]);
}

function outputs(result: { newItems: readonly unknown[] }): unknown[] {
  return result.newItems
    .filter((item) => (item as { type?: string }).type === "tool_call_output_item")
    .map((item) => {
      const output = (item as { output: unknown }).output;
      return typeof output === "string" && output.startsWith("{") ? (JSON.parse(output) as unknown) : output;
    });
}

describe("OpenAI Agents SDK adapter", () => {
  test("a re-run agent gets the same keys and the stored results; the upstream runs once", async () => {
    const calls: [string, Record<string, unknown>][] = [
      ["mail__send", { to: "ann@example.com", subject: "shipped", body: "your order shipped" }],
      ["search__query", { query: "returns" }],
      ["mail__send", { to: "bob@example.com", subject: "shipped", body: "yours too" }],
    ];
    const drive = async () => {
      const run = sluice.run("oa-redrive-1");
      const agentTools = new SluiceAgentTools(sluice, run);
      const agent = new Agent({ name: "shop", model: scripted(...calls), tools: agentTools.tools("mail/send", "search/query") });
      const result = await runAgent(agent, "tell the customers");
      const effects = await sluice.client.listRunEffects(run.id);
      return { result, effects };
    };
    const mailBefore = world.mail.length;
    const first = await drive();
    const again = await drive();
    assert.deepEqual(
      first.effects.map((e) => e.command_key).sort(),
      ["d-1/mail/send/0", "d-1/mail/send/1", "d-1/search/query/0"],
    );
    assert.deepEqual(again.effects.map((e) => e.idempotency_key), first.effects.map((e) => e.idempotency_key));
    assert.ok(first.effects.every((e) => e.status === "CONFIRMED"));
    assert.deepEqual(outputs(again.result), outputs(first.result));
    assert.equal((outputs(first.result)[0] as { to: string }).to, "ann@example.com");
    assert.equal(world.mail.length, mailBefore + 2, "each mail was sent once");
    assert.deepEqual(
      world.mail.slice(mailBefore).map((m) => m.idempotencyKey),
      ["oa-redrive-1/d-1/mail/send/0", "oa-redrive-1/d-1/mail/send/1"],
    );
    assert.equal(again.result.finalOutput, "done");
  });

  test("a call Sluice holds for approval is the SDK's interruption until a person approves in Sluice", async () => {
    const run = sluice.run("oa-approval-1");
    const agentTools = new SluiceAgentTools(sluice, run);
    const agent = new Agent({
      name: "bank",
      model: scripted(["bank__wire", { account: "acc-oa", amount_minor: 250_000 }]),
      tools: agentTools.tools("bank/wire"),
    });
    let result = await runAgent(agent, "pay the invoice");
    // The SDK's own human-in-the-loop stop, not an error; nothing ran upstream.
    assert.deepEqual(result.interruptions.map((item) => item.name), ["bank__wire"]);
    assert.equal(world.wires.filter((w) => w.account === "acc-oa").length, 0);
    const pending = agentTools.pending(result.interruptions[0]!);
    assert.equal(pending?.commandKey, "d-1/bank/wire/0");
    assert.match(pending?.remedy ?? "", /sluice approve oa-approval-1 d-1\/bank\/wire\/0/);
    // Nobody decided yet: it stays pending.
    assert.deepEqual((await agentTools.settle(result.state, { timeoutMs: 300 })).map((p) => p.commandKey), ["d-1/bank/wire/0"]);
    const approved = await asAdmin(server.url, "POST", `/v1/runs/oa-approval-1/effects/${encodeURIComponent(pending!.commandKey)}:approve`, { reason: "invoice checked" });
    assert.equal(approved.status, 200, JSON.stringify(approved.body));
    assert.deepEqual(await agentTools.settle(result.state, { timeoutMs: 20_000 }), []);
    result = await runAgent(agent, result.state);
    const [wire] = outputs(result) as { id: string; account: string }[];
    assert.equal(wire?.account, "acc-oa");
    assert.equal(wire?.id, world.wires.find((w) => w.account === "acc-oa")?.id);
    assert.equal(world.wires.filter((w) => w.account === "acc-oa").length, 1);
    assert.equal(result.finalOutput, "done");
  });

  test("rejected in the SDK, the effect is removed from Sluice and nothing runs", async () => {
    const run = sluice.run("oa-reject-1");
    const agentTools = new SluiceAgentTools(sluice, run);
    const agent = new Agent({
      name: "bank",
      model: scripted(["bank__wire", { account: "acc-no", amount_minor: 300_000 }]),
      tools: agentTools.tools("bank/wire"),
    });
    let result = await runAgent(agent, "pay the invoice");
    await agentTools.reject(result.state, result.interruptions[0]!, "not our vendor");
    result = await runAgent(agent, result.state);
    assert.ok(outputs(result).some((output) => String(output).includes("not our vendor")), JSON.stringify(outputs(result)));
    const [effect] = await sluice.client.listRunEffects(run.id);
    assert.equal(effect?.status, "CANCELLED");
    assert.equal(world.wires.filter((w) => w.account === "acc-no").length, 0);
  });
});
