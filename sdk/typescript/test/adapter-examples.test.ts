// The TypeScript agent-framework examples (examples/agents/openai-agents-js, .../vercel-ai) run
// as a consumer runs them, on their frameworks' test models: copied beside the installed
// package (build-test/, where @sluice/client and the frameworks are installed), against
// `sluice dev` with the example catalog and the demo upstream; twice with one run id (one wire,
// one email), and once with a wire Sluice holds for approval, which a person approves.
import assert from "node:assert/strict";
import { type ChildProcess, execFile, spawn } from "node:child_process";
import { copyFileSync, mkdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { after, before, describe, test } from "node:test";

import { asAdmin, REPO, SLUICE_BIN, type SluiceProcess, startSluice, TOKENS } from "./harness.js";

const run = promisify(execFile);
const BUILD_TEST = fileURLToPath(new URL("../", import.meta.url));
const FINAL = "final: Paid invoice 42 and told accounts payable.\n";

let upstream: ChildProcess;
let upstreamUrl: string;
let server: SluiceProcess;

before(async () => {
  upstream = spawn(SLUICE_BIN, ["bench-upstream", "--listen", "127.0.0.1:0"], { stdio: ["ignore", "pipe", "ignore"] });
  upstreamUrl = await new Promise<string>((resolve, reject) => {
    createInterface({ input: upstream.stdout! }).once("line", (line) => {
      const url = /http:\/\/\S+/.exec(line)?.[0];
      return url === undefined ? reject(new Error(`the demo upstream did not say where it listens: ${line}`)) : resolve(url);
    });
  });
  const catalog = readFileSync(join(REPO, "deploy/catalog.toml"), "utf8").replaceAll("http://127.0.0.1:8787", upstreamUrl);
  server = await startSluice(catalog);
});

after(async () => {
  await server?.stop();
  upstream?.kill();
});

async function stats(): Promise<{ wires: number; emails: number }> {
  const { wires, emails } = (await (await fetch(`${upstreamUrl}/_stats`)).json()) as { wires: number; emails: number };
  return { wires, emails };
}

/** The example's script, copied where a consumer project has the packages installed. */
function installed(example: string): string {
  const dir = join(BUILD_TEST, "examples", example);
  mkdirSync(dir, { recursive: true });
  copyFileSync(join(REPO, "examples/agents", example, "agent.mjs"), join(dir, "agent.mjs"));
  return join(dir, "agent.mjs");
}

function environment(runId: string, extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...process.env, SLUICE_URL: server.url, SLUICE_TOKEN: TOKENS.admin, RUN_ID: runId, ...extra };
  // The framework's test model, never a real one.
  delete env["OPENAI_API_KEY"];
  delete env["AI_GATEWAY_API_KEY"];
  return env;
}

describe("agent framework examples", () => {
  // Each example pays its own amounts: a wire's business key holds the amount, and one wire
  // with another's key would be answered with that one (Sluice's dedup), not sent.
  for (const [index, example] of ["openai-agents-js", "vercel-ai"].entries()) {
    const small = String(125_000 + index);
    const large = String(2_500_000 + index);
    test(`${example} runs on its test model, once per run id, and waits for Sluice's approval`, async () => {
      const script = installed(example);
      const before = await stats();
      const first = await run(process.execPath, [script], { env: environment(`${example}-1`, { AMOUNT_MINOR: small }) });
      const again = await run(process.execPath, [script], { env: environment(`${example}-1`, { AMOUNT_MINOR: small }) });
      assert.equal(again.stdout, first.stdout);
      assert.ok(first.stdout.endsWith(FINAL), first.stdout);
      assert.equal(first.stdout.split("tool output: ").length - 1, 2, first.stdout);
      assert.match(first.stdout, /"beneficiary":"supplier-7"/);
      assert.deepEqual(await stats(), { wires: before.wires + 1, emails: before.emails + 1 });

      // Above approve_above: the agent stops at its framework's approval and waits for Sluice's.
      const waiting = spawn(process.execPath, [script], {
        env: environment(`${example}-2`, { AMOUNT_MINOR: large, APPROVAL_TIMEOUT_S: "60" }),
        stdio: ["ignore", "pipe", "pipe"],
      });
      let stderr = "";
      waiting.stderr!.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
      const output: string[] = [];
      const exited = new Promise<number | null>((resolve) => waiting.once("close", resolve));
      const firstLine = new Promise<string>((resolve) =>
        createInterface({ input: waiting.stdout! }).on("line", (line) => {
          output.push(line);
          resolve(line);
        }),
      );
      assert.match(await firstLine, /^waiting for a person's approval of d-1\/payments\/wire\/0: /);
      assert.match(await firstLine, new RegExp(`sluice approve ${example}-2 d-1/payments/wire/0`));
      assert.equal((await stats()).wires, before.wires + 1, "nothing ran before the approval");
      const approved = await asAdmin(server.url, "POST", `/v1/runs/${example}-2/effects/${encodeURIComponent("d-1/payments/wire/0")}:approve`, { reason: "invoice checked" });
      assert.equal(approved.status, 200, JSON.stringify(approved.body));
      assert.equal(await exited, 0, stderr);
      assert.equal(`${output.at(-1)}\n`, FINAL, output.join("\n"));
      assert.match(output.join("\n"), new RegExp(`"amount_minor":${large}`));
      assert.deepEqual(await stats(), { wires: before.wires + 2, emails: before.emails + 2 });
    });
  }
});
