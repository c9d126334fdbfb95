// The agent side end to end: the SDK against `sluice dev` and a tool server built with the
// SDK's ToolServer, both real and on loopback.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import {
  ApprovalRequiredError,
  ArgumentDriftError,
  DefinitionError,
  EffectCancelledError,
  EffectFailedError,
  EffectRolledBackError,
  EffectStuckError,
  ForbiddenError,
  InvalidRequestError,
  NotFoundError,
  RunRolledBackError,
  Sluice,
  SluiceClient,
  SluiceError,
  UnauthenticatedError,
} from "@sluice/client";
import { asAdmin, CATALOG_HEADER, eventually, listen, type SluiceProcess, startSluice, TOKENS } from "./harness.js";
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

describe("journal", () => {
  test("a re-driven agent produces the same keys and gets the stored results back", async () => {
    const sendMail = sluice.guard<{ to: string; subject: string; body: string }, { id: string }>("mail/send");
    const openTicket = sluice.guard<{ title: string }, { id: string }>("tickets/create", { compensate: true });
    const agent = async () => {
      const first = await sendMail({ to: "ops@example.com", subject: "hello", body: "one" });
      Sluice.currentRun()?.decide();
      const ticket = await openTicket({ title: "disk full" });
      const second = await sendMail({ to: "ops@example.com", subject: "again", body: "two" });
      return [first.id, ticket.id, second.id];
    };
    const firstDrive = await sluice.agent("redrive-1", agent);
    const mailBefore = world.mail.length;
    const secondDrive = await sluice.agent("redrive-1", agent);
    assert.deepEqual(secondDrive, firstDrive);
    assert.equal(world.mail.length, mailBefore, "the re-driven agent sent no new mail");
    assert.equal(world.tickets.filter((t) => t.title === "disk full").length, 1);
    const keys = (await sluice.client.listRunEffects("redrive-1")).map((c) => c.idempotency_key);
    assert.deepEqual(keys, ["redrive-1/d-1/mail/send/0", "redrive-1/d-2/mail/send/0", "redrive-1/d-2/tickets/create/0"].sort());
    for (const key of keys) {
      assert.equal(world.dispatchKeys.filter((k) => k === key).length, 1, `${key} dispatched once`);
    }
  });

  test("other arguments at a recorded position are argument drift", async () => {
    const run = sluice.run("drift-1");
    await run.call("mail/send", { to: "a@example.com", subject: "first", body: "x" });
    const redriven = sluice.run("drift-1");
    const error = await redriven.call("mail/send", { to: "a@example.com", subject: "changed", body: "x" }).catch((e: unknown) => e);
    assert.ok(error instanceof ArgumentDriftError, String(error));
    assert.equal(error.runId, "drift-1");
    assert.equal(error.commandKey, "d-1/mail/send/0");
    assert.equal(error.commandStatus, "CONFIRMED");
    assert.equal(error.storedArgs?.["subject"], "first");
    assert.equal(error.args["subject"], "changed");
    assert.match(error.message, /run\.decide\(\)/);
  });
});

describe("outcomes", () => {
  test("an ambiguous NON_IDEMPOTENT call is reconciled by its status check, not retried", async () => {
    const run = sluice.run("reconcile-1");
    const command = await run.submit("bank/wire", { account: "acc-r", amount_minor: 700, reference: "commit-then-crash" });
    assert.equal(command.status, "CONFIRMED");
    assert.equal(command.ambiguous_before, true, "the dispatch's answer was lost");
    const booked = world.wires.filter((w) => w.account === "acc-r");
    assert.equal(booked.length, 1, "booked once, never redispatched");
    assert.equal(command.external_ref, booked[0]?.id);
  });

  test("an effect still moving when Prefer: wait ends (202) is long-polled until it settles", async () => {
    const requests: string[] = [];
    const watched: typeof fetch = async (input, init) => {
      const response = await fetch(input, init);
      requests.push(`${init?.method ?? "GET"} ${response.status} ${String(input)}`);
      return response;
    };
    const patient = await Sluice.connect({ url: server.url, token: TOKENS.agentA, fetch: watched, wait: { pollSeconds: 1 } });
    const command = await patient.run("slow-1").submit("mail/send", { to: "slow@example.com", subject: "s", body: "b" });
    assert.equal(command.status, "CONFIRMED");
    assert.ok(requests.some((r) => r.startsWith("POST 202 ")), requests.join("\n"));
    assert.ok(requests.some((r) => r.startsWith("GET 200 ") && r.includes("/effects/d-1%2Fmail%2Fsend%2F0?wait=1s")), requests.join("\n"));
  });

  test("a STUCK effect surfaces as EffectStuckError with its keys and what a person can do", async () => {
    const post = sluice.guard("ledger/post", { sideEffect: true, compensate: true });
    const error = await sluice.agent("stuck-1", () => post({ entry: "fee 12.00" })).catch((e: unknown) => e);
    assert.ok(error instanceof EffectStuckError, String(error));
    assert.equal(error.status, "STUCK");
    assert.equal(error.runId, "stuck-1");
    assert.equal(error.commandKey, "d-1/ledger/post/0");
    assert.equal(error.idempotencyKey, "stuck-1/d-1/ledger/post/0");
    assert.match(error.remedy, /sluice resolve stuck-1 d-1\/ledger\/post\/0/);
    assert.deepEqual(world.ledgerPosts, ["fee 12.00"], "never retried blindly");
  });

  test("a BLOCKED effect surfaces as ApprovalRequiredError; once approved, re-driving returns the result", async () => {
    const wire = sluice.guard<{ account: string; amount_minor: number }, { id: string }>("bank/wire", { compensate: true });
    const agent = () => sluice.agent("blocked-1", () => wire({ account: "acc-b", amount_minor: 250_000 }));
    const error = await agent().catch((e: unknown) => e);
    assert.ok(error instanceof ApprovalRequiredError, String(error));
    assert.equal(error.status, "BLOCKED");
    assert.equal(error.commandKey, "d-1/bank/wire/0");
    assert.match(error.remedy, /sluice approve blocked-1 d-1\/bank\/wire\/0/);
    assert.equal(world.wires.filter((w) => w.account === "acc-b").length, 0, "nothing sent before approval");
    const approved = await asAdmin(server.url, "POST", `/v1/runs/blocked-1/effects/${encodeURIComponent(error.commandKey)}:approve`, { reason: "checked the invoice" });
    assert.equal(approved.status, 200, JSON.stringify(approved.body));
    const result = await agent();
    assert.equal(result.id, world.wires.find((w) => w.account === "acc-b")?.id);
  });

  test("a refused effect is EffectFailedError; a rejected one EffectCancelledError", async () => {
    const failed = await sluice.run("failed-1").call("mail/send", { to: "nobody@example.com", subject: "s", body: "b" }).catch((e: unknown) => e);
    assert.ok(failed instanceof EffectFailedError, String(failed));
    assert.equal(failed.status, "FAILED");
    assert.equal(failed.commandKey, "d-1/mail/send/0");
    assert.match(failed.message, /mailbox nobody@example\.com does not exist/);
    assert.match(failed.remedy, /sluice replay failed-1 d-1\/mail\/send\/0/);

    const wire = () => sluice.run("cancelled-1").call("bank/wire", { account: "acc-c", amount_minor: 300_000 });
    const blocked = await wire().catch((e: unknown) => e);
    assert.ok(blocked instanceof ApprovalRequiredError, String(blocked));
    const rejected = await asAdmin(server.url, "POST", `/v1/runs/cancelled-1/effects/${encodeURIComponent(blocked.commandKey)}:reject`, { reason: "not this vendor" });
    assert.equal(rejected.status, 200, JSON.stringify(rejected.body));
    const cancelled = await wire().catch((e: unknown) => e);
    assert.ok(cancelled instanceof EffectCancelledError, String(cancelled));
    assert.equal(cancelled.status, "CANCELLED");
    assert.match(cancelled.remedy, /run\.decide\(\)/);
    // Who rejected it and why reach the agent.
    assert.equal(cancelled.rejection?.reason, "not this vendor");
    assert.match(cancelled.message, /rejected it: not this vendor/);
  });

  test("an approval link made with approvalLink approves the BLOCKED effect once, without a token", async () => {
    const wire = () => sluice.run("link-1").call("bank/wire", { account: "acc-link", amount_minor: 260_000 });
    const blocked = await wire().catch((e: unknown) => e);
    assert.ok(blocked instanceof ApprovalRequiredError, String(blocked));
    const admin = new SluiceClient({ url: server.url, token: TOKENS.admin });
    const link = await admin.approvalLink("link-1", blocked.commandKey, { expiresInS: 600, for: "carol@example.com" });
    assert.ok(link.url.startsWith(`${server.url}/approve/v1.`), link.url);
    assert.equal(link.for, "carol@example.com");
    // An agent may not make one.
    const agent = new SluiceClient({ url: server.url, token: TOKENS.agentA });
    const refused = await agent.approvalLink("link-1", blocked.commandKey).catch((e: unknown) => e);
    assert.ok(refused instanceof ForbiddenError, String(refused));
    const decide = (reason: string) =>
      fetch(link.url, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ decision: "approve", reason }) });
    assert.equal((await decide("invoice checked")).status, 200);
    assert.equal((await decide("twice")).status, 410);
    const result = (await wire()) as { id: string };
    assert.equal(result.id, world.wires.find((w) => w.account === "acc-link")?.id);
  });

  test("a read runs through a guard that says it has no side effect", async () => {
    const search = sluice.guard<{ query: string }, { results: string[] }>("search/query", { sideEffect: false });
    const found = await sluice.agent("read-1", () => search({ query: "refunds" }));
    assert.deepEqual(found.results, ["about refunds"]);
  });
});

describe("rollback", () => {
  test("an agent that fails rolls back its own run; the rollback is watched to its end", async () => {
    const openTicket = sluice.guard<{ title: string }, { id: string }>("tickets/create", { compensate: true });
    const wire = sluice.guard<{ account: string; amount_minor: number }, { id: string }>("bank/wire", { compensate: true });
    const failing = sluice.agent(
      "rollback-1",
      async (run) => {
        await openTicket({ title: "refund order 7" });
        // Journal order is decision, then call index: the wire comes after the ticket.
        run.decide();
        await wire({ account: "acc-rb", amount_minor: 900 });
        throw new Error("the model gave up");
      },
      { rollbackOnError: true },
    );
    await assert.rejects(failing, /the model gave up/);
    const run = sluice.run("rollback-1");
    let last;
    for await (const progress of run.watchRollback(100)) {
      last = progress;
    }
    assert.equal(last?.done, true);
    assert.deepEqual(
      last?.commands.map((c) => [c.command_key, c.status]),
      [["d-2/bank/wire/0", "COMPENSATED"], ["d-1/tickets/create/0", "COMPENSATED"]],
      "compensated last first",
    );
    assert.equal(world.tickets.find((t) => t.title === "refund order 7")?.closed, true);
    assert.equal(world.wires.find((w) => w.account === "acc-rb")?.reversed, true);

    const refused = await run.call("mail/send", { to: "a@example.com", subject: "late", body: "x" }).catch((e: unknown) => e);
    assert.ok(refused instanceof RunRolledBackError, String(refused));
    assert.equal(refused.runId, "rollback-1");
    const redriven = await sluice.run("rollback-1").call("tickets/create", { title: "refund order 7" }).catch((e: unknown) => e);
    assert.ok(redriven instanceof EffectRolledBackError, String(redriven));
    assert.equal(redriven.status, "COMPENSATED");
  });

  test("run.rollback of the agent's own run; another agent may not", async () => {
    const run = sluice.run("rollback-2");
    await run.call("tickets/create", { title: "to undo" });
    const other = await Sluice.connect({ url: server.url, token: TOKENS.agentB });
    await assert.rejects(other.run("rollback-2").rollback("not mine"), ForbiddenError);
    const started = await run.rollback("the user cancelled");
    assert.equal(started.rollback.compensating, 1);
    const progress = await eventually("the rollback to finish", async () => {
      const now = await run.rollbackProgress();
      return now.done ? now : undefined;
    });
    assert.equal(progress.commands[0]?.status, "COMPENSATED");
  });
});

describe("scheduled effects", () => {
  test("scheduleEffect, getScheduledEffects, removeScheduledEffect, and a scheduled effect running", async () => {
    sluice.defineEffect("send_reminder", { tool: "reminders/send" });
    const run = sluice.run("schedule-1");
    const later = await run.scheduleEffect("send_reminder", { text: "in a minute" }, 60_000);
    const muchLater = await run.scheduleEffect("send_reminder", { text: "in two minutes" }, 120_000);
    assert.equal(later.status, "SCHEDULED");
    assert.equal(later.commandKey, "d-1/reminders/send/0");
    assert.equal(muchLater.commandKey, "d-1/reminders/send/1");
    assert.deepEqual(
      (await run.getScheduledEffects()).map((s) => [s.name, s.commandKey, s.args["text"]]),
      [["send_reminder", later.commandKey, "in a minute"], ["send_reminder", muchLater.commandKey, "in two minutes"]],
    );
    assert.equal(await run.removeScheduledEffect(later.commandKey), true);
    assert.equal(await run.removeScheduledEffect(later.commandKey), false, "already cancelled");
    assert.deepEqual((await run.getScheduledEffects()).map((s) => s.commandKey), [muchLater.commandKey]);

    const soon = await run.scheduleEffect("send_reminder", { text: "now-ish" }, 300);
    const done = await run.wait(soon.commandKey);
    assert.equal(done.status, "CONFIRMED");
    assert.deepEqual(world.reminders.map((r) => r.text), ["now-ish"]);
    await assert.rejects(run.scheduleEffect("nope", {}, 10), SluiceError);
  });
});

describe("definition-time refusals", () => {
  test("guard and defineEffect check the server's declaration", () => {
    const refused = (make: () => unknown, pattern: RegExp) => assert.throws(make, (e: unknown) => e instanceof DefinitionError && pattern.test(e.message));
    refused(() => sluice.guard("mail/sned"), /not in the catalog.*mail\/send/);
    refused(() => sluice.guard("Mail/Send"), /not a tool name/);
    refused(() => sluice.guard("mail/send", { sideEffect: false }), /declares it IDEMPOTENT/);
    refused(() => sluice.guard("search/query"), /OBSERVE_ONLY.*sideEffect: false/);
    refused(() => sluice.guard("mail/send", { compensate: true }), /\[tool\.compensate\]/);
    refused(() => sluice.guard("bank/wire", { semantics: "IDEMPOTENT" }), /may commit twice/);
    refused(() => sluice.guard("legacy/fax"), /NON_IDEMPOTENT.*allowUnsafe: true/);
    assert.equal(sluice.guard("legacy/fax", { allowUnsafe: true }).tool.name, "legacy/fax");
    sluice.defineEffect("fax", { tool: "legacy/fax", allowUnsafe: true });
    refused(() => sluice.defineEffect("fax", { tool: "legacy/fax", allowUnsafe: true }), /already defined/);
  });

  test("a business key held by another run's command answers with that command, and says so", async () => {
    const client = new SluiceClient({ url: server.url, token: TOKENS.agentA });
    const wire = { account: "acc-held", amount_minor: 4_200 };
    const held = await client.submit({ run_id: "held-1", decision: 1, tool: "bank/wire", call_idx: 0, args: wire });
    assert.equal(held.existing, undefined, "recorded by this submission");
    const again = await client.submit({ run_id: "held-2", decision: 1, tool: "bank/wire", call_idx: 0, args: wire });
    assert.equal(again.existing, "business_key");
    assert.deepEqual([again.run_id, again.command_key], ["held-1", held.command_key]);
    const unwaited = await client.submit({ run_id: "held-3", decision: 1, tool: "bank/wire", call_idx: 0, args: wire }, false);
    assert.equal(unwaited.existing, "business_key");
    const repeated = await client.submit({ run_id: "held-1", decision: 1, tool: "bank/wire", call_idx: 0, args: wire });
    assert.equal(repeated.existing, "command_key");
    assert.equal(world.wires.filter((w) => w.account === "acc-held").length, 1, "one wire");
  });

  test("a guarded function called outside an agent run says how to call it", async () => {
    const sendMail = sluice.guard("mail/send");
    await assert.rejects(sendMail({ to: "a@example.com", subject: "s", body: "b" }), /inside sluice\.agent/);
  });
});

describe("API errors", () => {
  test("401, 403, 404 and 422 are typed", async () => {
    await assert.rejects(Sluice.connect({ url: server.url, token: "not-a-known-token-000" }), UnauthenticatedError);
    const other = new SluiceClient({ url: server.url, token: TOKENS.agentB });
    await assert.rejects(other.listRunEffects("redrive-1"), ForbiddenError);
    const client = new SluiceClient({ url: server.url, token: TOKENS.agentA });
    await assert.rejects(
      client.submit({ run_id: "errors-1", decision: 1, tool: "mail/nothing", call_idx: 0, args: {} }),
      (e: unknown) => e instanceof NotFoundError && e.code === "unknown_tool",
    );
    const invalid = await sluice.run("errors-1").call("bank/wire", { account: "acc", amount_minor: -5 }).catch((e: unknown) => e);
    assert.ok(invalid instanceof InvalidRequestError, String(invalid));
    assert.deepEqual(invalid.violations.map((v) => v.pointer), ["/args/amount_minor"]);
  });
});
