// The Vercel AI SDK adapter (@sluice/client/ai-sdk) in the SDK's real tool loop (`generateText`
// with `stopWhen`): the model is the SDK's own test double (`MockLanguageModelV4` from `ai/test`,
// scripted to call tools); `sluice dev` with its ledger and the tool server are real.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { generateText, isStepCount, type ModelMessage } from "ai";
import { MockLanguageModelV4 } from "ai/test";

import { Sluice } from "@sluice/client";
import { SluiceAiTools } from "@sluice/client/ai-sdk";
import { asAdmin, CATALOG_HEADER, listen, type SluiceProcess, startSluice, TOKENS } from "./harness.js";
import { tools, World } from "./world.js";

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

const usage = {
  inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 },
  outputTokens: { total: 1, text: 1, reasoning: 0 },
};

/** The SDK's test model: one tool call per step, in order, then a last answer. */
function scripted(...calls: [string, Record<string, unknown>][]): MockLanguageModelV4 {
  return new MockLanguageModelV4({
    doGenerate: [
      ...calls.map(([toolName, args], i) => ({
        content: [{ type: "tool-call" as const, toolCallId: `call-${i}`, toolName, input: JSON.stringify(args) }],
        finishReason: { unified: "tool-calls" as const, raw: undefined },
        usage,
        warnings: [],
      })),
      { content: [{ type: "text" as const, text: "done" }], finishReason: { unified: "stop" as const, raw: undefined }, usage, warnings: [] },
    ],
  });
}

function outputs(steps: readonly { toolResults: readonly { output: unknown }[] }[]): unknown[] {
  return steps.flatMap((step) => step.toolResults.map((result) => result.output));
}

describe("Vercel AI SDK adapter", () => {
  test("a re-run agent gets the same keys and the stored results; the upstream runs once", async () => {
    const calls: [string, Record<string, unknown>][] = [
      ["tickets__create", { title: "broken lamp" }],
      ["mail__send", { to: "ann@example.com", subject: "ticket", body: "opened" }],
      ["tickets__create", { title: "second lamp" }],
    ];
    const drive = async () => {
      const run = sluice.run("ai-redrive-1");
      const aiTools = new SluiceAiTools(sluice, run);
      const result = await generateText({
        model: scripted(...calls),
        ...aiTools.toolSet("tickets/create", "mail/send"),
        prompt: "open two tickets",
        stopWhen: isStepCount(5),
      });
      return { result, effects: await sluice.client.listRunEffects(run.id) };
    };
    const ticketsBefore = world.tickets.length;
    const first = await drive();
    const again = await drive();
    assert.deepEqual(
      first.effects.map((e) => e.command_key).sort(),
      ["d-1/mail/send/0", "d-1/tickets/create/0", "d-1/tickets/create/1"],
    );
    assert.deepEqual(again.effects.map((e) => e.idempotency_key), first.effects.map((e) => e.idempotency_key));
    assert.ok(first.effects.every((e) => e.status === "CONFIRMED"));
    assert.deepEqual(outputs(again.result.steps), outputs(first.result.steps));
    assert.equal((outputs(first.result.steps)[0] as { title: string }).title, "broken lamp");
    assert.equal(world.tickets.length, ticketsBefore + 2, "each ticket was opened once");
    assert.equal(again.result.text, "done");
  });

  test("a call Sluice holds is the SDK's tool-approval request, answered by Sluice's decision", async () => {
    const run = sluice.run("ai-approval-1");
    const aiTools = new SluiceAiTools(sluice, run);
    const model = scripted(
      ["bank__wire", { account: "acc-ai", amount_minor: 150_000 }],
      ["bank__wire", { account: "acc-ai-no", amount_minor: 160_000 }],
    );
    const messages: ModelMessage[] = [{ role: "user", content: "pay two invoices" }];
    const step = async () => {
      const result = await generateText({ model, ...aiTools.toolSet("bank/wire"), messages, stopWhen: isStepCount(5) });
      messages.push(...result.responseMessages);
      return result;
    };
    let result = await step();
    // The SDK's own approval request, not an error; nothing ran upstream.
    const requests = result.content.filter((part) => part.type === "tool-approval-request");
    assert.equal(requests.length, 1);
    assert.equal(world.wires.filter((w) => w.account === "acc-ai").length, 0);
    const pending = aiTools.pending("call-0");
    assert.equal(pending?.commandKey, "d-1/bank/wire/0");
    // Nobody decided yet: no answer.
    assert.deepEqual((await aiTools.approvals(result.content, { timeoutMs: 300 })).responses, []);
    const approved = await asAdmin(server.url, "POST", `/v1/runs/ai-approval-1/effects/${encodeURIComponent(pending!.commandKey)}:approve`, { reason: "invoice checked" });
    assert.equal(approved.status, 200, JSON.stringify(approved.body));
    const answered = await aiTools.approvals(result.content, { timeoutMs: 20_000 });
    assert.deepEqual(answered.responses.map((r) => r.approved), [true]);
    messages.push({ role: "tool", content: answered.responses });
    result = await step();
    // The approved wire ran once; the model then asked for a second one, which Sluice holds.
    assert.equal(world.wires.filter((w) => w.account === "acc-ai").length, 1);
    // Its result goes back to the model in the continuation's first message.
    const [approvedResult] = result.responseMessages.flatMap((message) =>
      message.role === "tool" && Array.isArray(message.content) ? message.content : [],
    );
    assert.equal(approvedResult?.type === "tool-result" && approvedResult.toolCallId, "call-0");
    const wire = approvedResult?.type === "tool-result" ? (approvedResult.output as unknown as { value: { account: string } }).value : undefined;
    assert.equal(wire?.account, "acc-ai");
    // The application denies the second itself: removed from Sluice, never run.
    const [second] = result.content.filter((part) => part.type === "tool-approval-request");
    assert.equal(second?.toolCall.toolCallId, "call-1");
    await aiTools.reject("call-1", "duplicate invoice");
    messages.push({
      role: "tool",
      content: [{ type: "tool-approval-response", approvalId: second!.approvalId, approved: false, reason: "duplicate invoice" }],
    });
    result = await step();
    assert.equal(result.text, "done");
    const effects = await sluice.client.listRunEffects(run.id);
    assert.deepEqual(
      effects.map((e) => [e.command_key, e.status]).sort(),
      [["d-1/bank/wire/0", "CONFIRMED"], ["d-1/bank/wire/1", "CANCELLED"]],
    );
    assert.equal(world.wires.filter((w) => w.account === "acc-ai-no").length, 0);
  });
});
