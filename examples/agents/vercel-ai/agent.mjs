// A Vercel AI SDK agent loop (generateText with tools) whose tools are Sluice's: it pays a
// supplier's invoice and tells accounts payable, each tool call an effect recorded in Sluice's
// ledger before it runs.
//
// Without AI_GATEWAY_API_KEY the model is the SDK's own test double (MockLanguageModelV4 from
// ai/test), scripted to make the calls a real model makes here; with it, a real model decides
// through the AI Gateway (SLUICE_EXAMPLE_MODEL, default openai/gpt-5-mini). Run it twice with
// the same RUN_ID: the second run gets the same keys and the stored results, and the bank books
// one wire. A wire above 10,000.00 (AMOUNT_MINOR > 1000000) waits for a person's approval in
// Sluice: the result carries the SDK's tool-approval request, answered once the person runs
// the printed `sluice approve` line.
import { generateText, isStepCount } from "ai";
import { MockLanguageModelV4 } from "ai/test";
import { Sluice } from "@sluice/client";
import { SluiceAiTools } from "@sluice/client/ai-sdk";

const runId = process.env.RUN_ID ?? "invoice-42";
const amount = Number(process.env.AMOUNT_MINOR ?? "125000");
const wire = { account: "acc-ops", beneficiary: "supplier-7", amount_minor: amount, date: "2026-11-22", reference: "invoice 42" };
const mail = { to: "ap@example.com", subject: "invoice 42 paid", body: `${amount} paid to supplier-7` };
const task =
  `Pay invoice 42: wire ${amount} minor units from acc-ops to supplier-7 dated 2026-11-22 ` +
  "(reference 'invoice 42'), then email ap@example.com that it is paid. Make each call once.";

function model() {
  if (process.env.AI_GATEWAY_API_KEY) {
    return process.env.SLUICE_EXAMPLE_MODEL ?? "openai/gpt-5-mini";
  }
  const usage = { inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 }, outputTokens: { total: 1, text: 1, reasoning: 0 } };
  const call = (toolCallId, toolName, args) => ({
    content: [{ type: "tool-call", toolCallId, toolName, input: JSON.stringify(args) }],
    finishReason: { unified: "tool-calls", raw: undefined },
    usage,
    warnings: [],
  });
  return new MockLanguageModelV4({
    doGenerate: [
      call("call-wire", "payments__wire", wire),
      call("call-mail", "email__send", mail),
      { content: [{ type: "text", text: "Paid invoice 42 and told accounts payable." }], finishReason: { unified: "stop", raw: undefined }, usage, warnings: [] },
    ],
  });
}

const sluice = await Sluice.connect(); // SLUICE_URL and SLUICE_TOKEN, as `sluice dev` prints them
const tools = new SluiceAiTools(sluice, sluice.run(runId));
const settings = { model: model(), ...tools.toolSet("payments/wire", "email/send"), stopWhen: isStepCount(6) };
const messages = [{ role: "user", content: task }];
const outputs = [];
for (;;) {
  const result = await generateText({ ...settings, messages });
  messages.push(...result.responseMessages);
  for (const message of result.responseMessages) {
    for (const part of message.role === "tool" ? message.content : []) {
      if (part.type === "tool-result") {
        outputs.push(part.output.value);
      }
    }
  }
  const requests = result.content.filter((part) => part.type === "tool-approval-request");
  if (requests.length === 0) {
    for (const output of outputs) {
      console.log(`tool output: ${JSON.stringify(output)}`);
    }
    console.log(`final: ${result.text}`);
    break;
  }
  for (const request of requests) {
    const pending = tools.pending(request.toolCall.toolCallId);
    console.log(`waiting for a person's approval of ${pending?.commandKey}: ${pending?.remedy}`);
  }
  const { responses, waiting } = await tools.approvals(result.content, { timeoutMs: Number(process.env.APPROVAL_TIMEOUT_S ?? "600") * 1000 });
  if (waiting.length > 0) {
    console.log(`still waiting; run this again with RUN_ID=${runId} once a person decided`);
    process.exit(3);
  }
  messages.push({ role: "tool", content: responses });
}
