/**
 * The upstream the end-to-end tests point Sluice at: a small mail, ticket, bank, ledger and
 * search service written with the SDK's own `ToolServer`, keeping a record of every call so
 * tests can check what happened upstream, not only what the ledger says.
 */

import { ToolRefusal, ToolServer } from "@sluice/client/tool-server";
import { SIGNING_KEY } from "./harness.js";

export interface Wire {
  id: string;
  account: string;
  amount_minor: number;
  reversed: boolean;
}

/** What the upstream did, in order. */
export class World {
  readonly mail: { id: string; to: string; idempotencyKey: string }[] = [];
  readonly tickets: { id: string; title: string; closed: boolean }[] = [];
  readonly wires: Wire[] = [];
  readonly reminders: { id: string; text: string }[] = [];
  readonly ledgerPosts: string[] = [];
  /** Every idempotency key a dispatch was called with. */
  readonly dispatchKeys: string[] = [];
  #next = 0;

  id(prefix: string): string {
    this.#next += 1;
    return `${prefix}-${this.#next}`;
  }
}

const text = { type: "string", minLength: 1, maxLength: 200 } as const;

/** The tool server of `world`. */
export function tools(world: World): ToolServer {
  // Verifies every call with the key the tests' `sluice dev` signs with (harness.startSluice).
  const server = new ToolServer({ signingKeys: [SIGNING_KEY] });
  server.define<{ to: string; subject: string; body: string }, { id: string; to: string }>({
    name: "mail/send",
    description: "Send an email",
    semantics: "IDEMPOTENT",
    schema: { type: "object", additionalProperties: false, required: ["to", "subject", "body"], properties: { to: text, subject: text, body: { type: "string" } } },
    dispatch: async (args, call) => {
      world.dispatchKeys.push(call.idempotencyKey);
      if (args.to.startsWith("nobody@")) {
        throw new ToolRefusal(`mailbox ${args.to} does not exist`);
      }
      if (args.to.startsWith("slow@")) {
        await new Promise((resolve) => setTimeout(resolve, 2_500));
      }
      const mail = { id: world.id("m"), to: args.to, idempotencyKey: call.idempotencyKey };
      world.mail.push(mail);
      return { id: mail.id, to: mail.to };
    },
  });
  server.define<{ title: string }, { id: string; title: string }>({
    name: "tickets/create",
    description: "Open a support ticket; closed again on rollback",
    semantics: "IDEMPOTENT",
    schema: { type: "object", additionalProperties: false, required: ["title"], properties: { title: text } },
    dispatch: async (args, call) => {
      world.dispatchKeys.push(call.idempotencyKey);
      const ticket = { id: world.id("t"), title: args.title, closed: false };
      world.tickets.push(ticket);
      return { id: ticket.id, title: ticket.title };
    },
    compensate: async ({ externalRef }) => {
      const ticket = world.tickets.find((t) => t.id === externalRef);
      if (ticket === undefined) {
        throw new ToolRefusal(`no ticket ${externalRef}`, 404);
      }
      ticket.closed = true;
      return { id: `close-${ticket.id}` };
    },
  });
  server.define<{ account: string; amount_minor: number; reference?: string }, Wire>({
    name: "bank/wire",
    description: "Send a wire; large ones need approval",
    semantics: "NON_IDEMPOTENT",
    businessKey: "{account}:{amount_minor}",
    schema: {
      type: "object",
      additionalProperties: false,
      required: ["account", "amount_minor"],
      properties: { account: text, amount_minor: { type: "integer", minimum: 1 }, reference: text },
    },
    policy: { approve_above: { field: "amount_minor", value: 100_000 }, settle_ms: 200, late_commit_ms: 200, verify_after_ms: 500 },
    dispatch: async (args, call) => {
      world.dispatchKeys.push(call.idempotencyKey);
      const wire = { id: world.id("w"), account: args.account, amount_minor: args.amount_minor, reversed: false };
      world.wires.push(wire);
      if (args.reference === "commit-then-crash") {
        // Committed, and then the answer is lost: only the status check can tell.
        throw new Error("crashed after booking the wire");
      }
      return wire;
    },
    statusCheck: async (businessKey) =>
      world.wires.filter((w) => !w.reversed && `${w.account}:${w.amount_minor}` === businessKey),
    compensate: async ({ externalRef }) => {
      const wire = world.wires.find((w) => w.id === externalRef);
      if (wire === undefined) {
        throw new ToolRefusal(`no wire ${externalRef}`, 404);
      }
      wire.reversed = true;
      return { id: `rev-${wire.id}` };
    },
  });
  server.define<{ entry: string }, { id: string }>({
    name: "ledger/post",
    description: "Post a ledger entry; its outcome cannot be looked up",
    semantics: "NON_IDEMPOTENT",
    schema: { type: "object", required: ["entry"], properties: { entry: text } },
    dispatch: async (args, call) => {
      world.dispatchKeys.push(call.idempotencyKey);
      world.ledgerPosts.push(args.entry);
      throw new Error("the ledger timed out after posting");
    },
    compensate: async () => ({ id: "reversed" }),
  });
  server.define<{ number: string }, { id: string }>({
    name: "legacy/fax",
    description: "Send a fax; nothing can look it up or undo it",
    semantics: "NON_IDEMPOTENT",
    allowUnsafe: true,
    schema: { type: "object", required: ["number"], properties: { number: text } },
    dispatch: async () => ({ id: world.id("f") }),
  });
  server.define<{ query: string }, { results: string[] }>({
    name: "search/query",
    description: "Search the knowledge base",
    semantics: "OBSERVE_ONLY",
    schema: { type: "object", required: ["query"], properties: { query: text } },
    dispatch: async (args) => ({ results: [`about ${args.query}`] }),
  });
  server.define<{ text: string }, { id: string }>({
    name: "reminders/send",
    description: "Send a reminder",
    semantics: "IDEMPOTENT",
    schema: { type: "object", required: ["text"], properties: { text } },
    dispatch: async (args, call) => {
      world.dispatchKeys.push(call.idempotencyKey);
      const reminder = { id: world.id("r"), text: args.text };
      world.reminders.push(reminder);
      return reminder;
    },
  });
  return server;
}
