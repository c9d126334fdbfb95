/**
 * The real parts the tests run against: `sluice dev` (the binary in `SLUICE_BIN`, default
 * /work/bin/sluice) on a fresh SQLite directory and a free loopback port, with a config and a
 * catalog written here; and tool servers on loopback, whose calls are signed as Sluice signs
 * them (Standard Webhooks, with the `standardwebhooks` library itself). Nothing is mocked.
 */

import { type ChildProcess, spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer, type RequestListener, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

import { Webhook } from "standardwebhooks";

import { newSigningKey, SIGNING_KEYS_ENV } from "@sluice/client/tool-server";

/** The repository's root (the package is sdk/typescript; tests run from build-test/test). */
export const REPO = fileURLToPath(new URL("../../../../", import.meta.url));

export const SLUICE_BIN = process.env["SLUICE_BIN"] ?? "/work/bin/sluice";

/** Bearer tokens of the test server: two agents and an admin. */
export const TOKENS = {
  agentA: "agent-a-token-0123456789",
  agentB: "agent-b-token-0123456789",
  admin: "admin-token-0123456789",
} as const;

/** The key the tests' tool servers verify and the tests' `sluice dev` signs with. */
export const SIGNING_KEY = newSigningKey();

/**
 * The three headers of a request whose raw body is `body`, signed with `keys` (one `v1,`
 * entry per key) at `timestamp` (default: now) under `id` (default: a new one).
 */
export function signed(
  body: string,
  keys: readonly string[] = [SIGNING_KEY],
  { id = `msg_${randomUUID()}`, timestamp = Math.floor(Date.now() / 1000) }: { id?: string; timestamp?: number } = {},
): Record<string, string> {
  const at = new Date(timestamp * 1000);
  return {
    "webhook-id": id,
    "webhook-timestamp": String(timestamp),
    "webhook-signature": keys.map((key) => new Webhook(key).sign(id, at, body)).join(" "),
  };
}

/** A running `sluice dev`. */
export interface SluiceProcess {
  url: string;
  /** Everything it logged, for a failing test's message. */
  log(): string;
  stop(): Promise<void>;
}

/** The catalog's first lines, before the tools' entries. */
export const CATALOG_HEADER = `default_namespace = "default"
policy_version = "sdk-test-1"
max_clock_skew_ms = 100
`;

/** Configuration sections and keys (docs/configuration.md) over the tests' defaults. */
export type Settings = Record<string, Record<string, string | number | boolean>>;

/**
 * Starts `sluice dev` with `catalog` (TOML), the test tokens and `settings`, signing its calls
 * to tool services with `signingKeys` (given in SLUICE_TOOL_SIGNING_KEYS, which the printed
 * catalogs' credential names); resolves once it serves.
 */
export async function startSluice(
  catalog: string,
  settings: Settings = {},
  signingKeys: readonly string[] = [SIGNING_KEY],
): Promise<SluiceProcess> {
  const dir = mkdtempSync(join(tmpdir(), "sluice-ts-"));
  writeFileSync(join(dir, "catalog.toml"), catalog);
  const sections: Settings = {
    ledger: { data_dir: join(dir, "data"), durability: "normal" },
    catalog: { path: join(dir, "catalog.toml") },
    producer: { listen: "127.0.0.1:0" },
    reconciler: { sweep_interval_ms: 200 },
    telemetry: { log_format: "json", log_level: "info" },
  };
  for (const [section, keys] of Object.entries(settings)) {
    sections[section] = { ...sections[section], ...keys };
  }
  const tokens = [
    ["agent-a", "agent", TOKENS.agentA],
    ["agent-b", "agent", TOKENS.agentB],
    ["admin-1", "admin", TOKENS.admin],
  ].map(([name, role, token]) => `[[auth.tokens]]\nname = "${name}"\nrole = "${role}"\ntoken = "${token}"\n`);
  const config = Object.entries(sections).map(
    ([section, keys]) =>
      `[${section}]\n${Object.entries(keys).map(([key, value]) => `${key} = ${JSON.stringify(value)}\n`).join("")}`,
  );
  writeFileSync(join(dir, "sluice.toml"), [...config, ...tokens].join(""));
  const child = spawn(SLUICE_BIN, ["dev", "-c", join(dir, "sluice.toml")], {
    stdio: ["ignore", "pipe", "pipe"],
    env: { ...process.env, SLUICE_URL: "", SLUICE_TOKEN: "", [SIGNING_KEYS_ENV]: signingKeys.join(" ") },
  });
  const lines: string[] = [];
  const url = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`sluice dev did not start:\n${lines.join("\n")}`)), 30_000);
    child.once("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`sluice dev exited with ${code}:\n${lines.join("\n")}`));
    });
    for (const stream of [child.stdout, child.stderr]) {
      createInterface({ input: stream }).on("line", (line) => {
        lines.push(line);
        const url = startedAt(line);
        if (url !== undefined) {
          clearTimeout(timer);
          resolve(url);
        }
      });
    }
  });
  return {
    url,
    log: () => lines.join("\n"),
    stop: async () => {
      await stop(child);
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** The URL in the "sluice dev is running" log line, if `line` is it. */
function startedAt(line: string): string | undefined {
  try {
    const event = JSON.parse(line) as { fields?: { message?: string; url?: string } };
    return event.fields?.message?.startsWith("sluice dev is running") ? event.fields.url : undefined;
  } catch {
    return undefined;
  }
}

async function stop(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) {
    return;
  }
  const exited = new Promise((resolve) => child.once("exit", resolve));
  child.kill("SIGTERM");
  const timer = setTimeout(() => child.kill("SIGKILL"), 10_000);
  await exited;
  clearTimeout(timer);
}

/** An HTTP server on a free loopback port. */
export async function listen(handler: RequestListener): Promise<{ url: string; server: Server; close(): Promise<void> }> {
  const server = createServer(handler);
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    server,
    close: () =>
      new Promise<void>((resolve, reject) => {
        server.closeAllConnections();
        server.close((error) => (error ? reject(error) : resolve()));
      }),
  };
}

/** An admin's request to the server, for what agents may not do (approve, reject). */
export async function asAdmin(url: string, method: string, path: string, body?: unknown): Promise<{ status: number; body: unknown }> {
  const response = await fetch(url + path, {
    method,
    headers: { authorization: `Bearer ${TOKENS.admin}`, "content-type": "application/json" },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  });
  return { status: response.status, body: (await response.json()) as unknown };
}

/** The shared key and journal vectors, read from the repository (no copy). */
export function vectors(): JournalVectors {
  return JSON.parse(readFileSync(join(REPO, "sdk/test-vectors/journal.json"), "utf8")) as JournalVectors;
}

export interface JournalVectors {
  keys: {
    run_id: string;
    decision: number;
    tool: string;
    call_idx: number;
    command_key: string;
    idempotency_key: string;
    command_key_path_segment: string;
  }[];
  journals: { name: string; steps: string[]; keys: string[] }[];
  invalid: { run_ids: string[]; tool_names: string[]; command_keys: string[] };
}

/** Polls `check` every 50 ms until it returns a value other than `undefined`, or fails after `ms`. */
export async function eventually<T>(what: string, check: () => Promise<T | undefined>, ms = 20_000): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const value = await check();
    if (value !== undefined) {
      return value;
    }
    if (Date.now() > deadline) {
      throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}
