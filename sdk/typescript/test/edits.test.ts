// Edit and approve through the SDK, against `sluice dev` whose catalog puts wires under a
// per-run spend budget: a submission past it is a BudgetExceededError with the budget's figures;
// an approver's edit (Run.approve with args) is refused the same way past it, and otherwise
// reaches the agent as a revision of the same effect, which ran with the edited arguments.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { ApprovalRequiredError, BudgetExceededError, ConflictError, Sluice, SluiceClient } from "@sluice/client";
import { CATALOG_HEADER, listen, type SluiceProcess, startSluice, TOKENS } from "./harness.js";
import { tools, World } from "./world.js";

let world: World;
let upstream: Awaited<ReturnType<typeof listen>>;
let server: SluiceProcess;

const MONEY = '[tool.money.amount_minor]\ncurrency = "EUR"\nminor_units = 2\n\n';
const BUDGET = `
[budgets.wires]
tools = ["bank/wire"]
scope = "run"
window = "total"
limits = { EUR = 300000 }
on_exceed = "deny"
`;

before(async () => {
  world = new World();
  const toolServer = tools(world);
  upstream = await listen(toolServer.handler);
  let catalog = toolServer.catalogToml(upstream.url);
  const wire = catalog.indexOf('name = "bank/wire"');
  const dispatch = catalog.indexOf("[tool.dispatch]", wire);
  catalog = catalog.slice(0, dispatch) + MONEY + catalog.slice(dispatch) + BUDGET;
  server = await startSluice(CATALOG_HEADER + "\n" + catalog);
});

after(async () => {
  await server?.stop();
  await upstream?.close();
});

test("an approver's edit reaches the agent; budgets refuse with their figures", async () => {
  const sluice = await Sluice.connect({ url: server.url, token: TOKENS.agentA });
  const admin = new SluiceClient({ url: server.url, token: TOKENS.admin });
  const run = "edit-1";
  // Each Run handle starts at the run's first journal position: a new handle re-drives it.
  const handle = sluice.run(run);
  const blocked = await handle
    .call("bank/wire", { account: "acc-e", amount_minor: 250_000 })
    .catch((e: unknown) => e);
  assert.ok(blocked instanceof ApprovalRequiredError, String(blocked));
  // 250,000 of 300,000 held: 100,000 more would pass the budget; nothing is recorded.
  const refused = await handle
    .call("bank/wire", { account: "acc-f", amount_minor: 100_000 })
    .catch((e: unknown) => e);
  assert.ok(refused instanceof BudgetExceededError, String(refused));
  assert.ok(refused instanceof ConflictError);
  assert.deepEqual(
    [refused.budget, refused.currency, refused.limit, refused.spent, refused.amount],
    ["wires", "EUR", 300_000, 250_000, 100_000],
  );
  // An edit past the budget: refused the same way, nothing changed.
  const tooMuch = await admin
    .approve(run, blocked.commandKey, "more", { account: "acc-e", amount_minor: 350_000 })
    .catch((e: unknown) => e);
  assert.ok(tooMuch instanceof BudgetExceededError, String(tooMuch));
  assert.deepEqual([tooMuch.spent, tooMuch.amount], [0, 350_000]);
  // The edit: 150,000, a revision of the same effect.
  const approved = await admin.approve(run, blocked.commandKey, "the invoice says 1,500.00", {
    account: "acc-e",
    amount_minor: 150_000,
  });
  assert.equal(approved.status, "APPROVED");
  assert.equal(approved.revisions?.length, 1);
  const revision = approved.revisions![0]!;
  assert.equal(revision.by, "admin-1");
  assert.deepEqual(revision.changes, [{ pointer: "/amount_minor", kind: "changed", old: 250_000, new: 150_000 }]);
  // Re-driven with what it first submitted, the agent gets the edited wire; the bank got 150,000.
  const done = await sluice.run(run).submit("bank/wire", { account: "acc-e", amount_minor: 250_000 });
  assert.equal(done.status, "CONFIRMED");
  assert.equal(done.revisions?.[0]?.reason, "the invoice says 1,500.00");
  assert.equal((done.result as { amount_minor: number }).amount_minor, 150_000);
  assert.deepEqual(
    world.wires.filter((w) => w.account === "acc-e").map((w) => w.amount_minor),
    [150_000],
  );
});
