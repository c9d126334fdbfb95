// An OpenAI Agents SDK (JS) agent whose tools are Sluice's: it pays a supplier's invoice and
// tells accounts payable, each tool call an effect recorded in Sluice's ledger before it runs.
//
// Without OPENAI_API_KEY the model is the SDK's own test double (ScriptedModel from
// @openai/agents/testing), scripted to make the calls a real model makes here; with it, a real
// OpenAI model decides. Run it twice with the same RUN_ID: the second run gets the same keys and
// the stored results, and the bank books one wire. A wire above 10,000.00 (AMOUNT_MINOR >
// 1000000) waits for a person's approval in Sluice: the run stops with the SDK's interruption
// and goes on once the person runs the printed `sluice approve` line.
import { Agent, run as runAgent, setTracingDisabled } from "@openai/agents";
import { assistantMessage, functionCall, ScriptedModel } from "@openai/agents/testing";
import { Sluice } from "@sluice/client";
import { SluiceAgentTools } from "@sluice/client/openai-agents";

const runId = process.env.RUN_ID ?? "invoice-42";
const amount = Number(process.env.AMOUNT_MINOR ?? "125000");
const wire = { account: "acc-ops", beneficiary: "supplier-7", amount_minor: amount, date: "2026-11-22", reference: "invoice 42" };
const mail = { to: "ap@example.com", subject: "invoice 42 paid", body: `${amount} paid to supplier-7` };
const task =
  `Pay invoice 42: wire ${amount} minor units from acc-ops to supplier-7 dated 2026-11-22 ` +
  "(reference 'invoice 42'), then email ap@example.com that it is paid.";

function model() {
  if (process.env.OPENAI_API_KEY) {
    return process.env.SLUICE_EXAMPLE_MODEL; // undefined: the SDK's default model
  }
  setTracingDisabled(true);
  return new ScriptedModel([
    [functionCall("payments__wire", wire, { callId: "call-wire" })],
    [functionCall("email__send", mail, { callId: "call-mail" })],
    [assistantMessage("Paid invoice 42 and told accounts payable.")],
  ]);
}

const sluice = await Sluice.connect(); // SLUICE_URL and SLUICE_TOKEN, as `sluice dev` prints them
const tools = new SluiceAgentTools(sluice, sluice.run(runId));
const agent = new Agent({
  name: "accounts payable",
  instructions: "You pay invoices with the tools you have. Make each call once.",
  model: model(),
  tools: tools.tools("payments/wire", "email/send"),
});
let result = await runAgent(agent, task);
while (result.interruptions.length > 0) {
  for (const item of result.interruptions) {
    const pending = tools.pending(item);
    if (pending !== undefined) {
      console.log(`waiting for a person's approval of ${pending.commandKey}: ${pending.remedy}`);
    }
  }
  const waiting = await tools.settle(result.state, { timeoutMs: Number(process.env.APPROVAL_TIMEOUT_S ?? "600") * 1000 });
  if (waiting.length > 0) {
    console.log(`still waiting; run this again with RUN_ID=${runId} once a person decided`);
    process.exit(3);
  }
  result = await runAgent(agent, result.state);
}
for (const item of result.newItems) {
  if (item.type === "tool_call_output_item") {
    console.log(`tool output: ${item.output}`);
  }
}
console.log(`final: ${result.finalOutput}`);
