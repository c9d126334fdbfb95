// The README's quickstart, extracted and run exactly as written, as an installed package,
// against `sluice dev` with the example catalog and the demo upstream it calls.
import assert from "node:assert/strict";
import { execFile, spawn } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { after, before, test } from "node:test";

import { REPO, SLUICE_BIN, type SluiceProcess, startSluice, TOKENS } from "./harness.js";

const PACKAGE = join(REPO, "sdk/typescript");
/**
 * The package the quickstart imports: the npm tarball installed into build-test/ (what
 * scripts/suites/typescript-sdk.sh does, and then sets SLUICE_SDK_FROM_TARBALL), else this
 * directory as built (`npm test`).
 */
const INSTALLED = fileURLToPath(new URL("../node_modules/@sluice/client", import.meta.url));
let upstream: { url: string; stop(): void };
let server: SluiceProcess;
let dir: string;

/** The code between the README's quickstart markers, without its fence. */
function quickstart(): string {
  const marked = /<!-- quickstart:typescript -->\n```js\n([\s\S]*?)```\n<!-- \/quickstart:typescript -->/;
  const block = marked.exec(readFileSync(join(PACKAGE, "README.md"), "utf8"));
  assert.ok(block?.[1], "README.md has a ```js block between the quickstart:typescript markers");
  // The repository's README shows the same block; both are held to running as written.
  const shown = marked.exec(readFileSync(join(REPO, "README.md"), "utf8"));
  assert.equal(shown?.[1], block[1], "the repository README shows the same quickstart");
  return block[1];
}

before(async () => {
  // The demo upstream the example catalog calls, on a port of its own.
  const child = spawn(SLUICE_BIN, ["bench-upstream", "--listen", "127.0.0.1:0"], { stdio: ["ignore", "pipe", "inherit"] });
  const url = await new Promise<string>((resolve, reject) => {
    child.once("exit", (code) => reject(new Error(`the demo upstream exited with ${code}`)));
    createInterface({ input: child.stdout }).once("line", (line) => resolve(line.replace(/^upstream listening on /, "")));
  });
  upstream = { url, stop: () => child.kill("SIGTERM") };
  const catalog = readFileSync(join(REPO, "deploy/catalog.toml"), "utf8").replaceAll("http://127.0.0.1:8787", url);
  server = await startSluice(catalog);
  // The package as an agent project installs it: node_modules/@sluice/client.
  dir = mkdtempSync(join(tmpdir(), "sluice-quickstart-"));
  mkdirSync(join(dir, "node_modules/@sluice"), { recursive: true });
  const installed = process.env["SLUICE_SDK_FROM_TARBALL"] ? INSTALLED : PACKAGE;
  assert.ok(existsSync(join(installed, "package.json")), `no package at ${installed}`);
  symlinkSync(installed, join(dir, "node_modules/@sluice/client"), "dir");
  writeFileSync(join(dir, "quickstart.mjs"), quickstart());
});

after(async () => {
  await server?.stop();
  upstream?.stop();
  if (dir) {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("the quickstart has at most 15 lines", () => {
  assert.ok(quickstart().trimEnd().split("\n").length <= 15);
});

test("the quickstart runs as written, and again with the same results and nothing sent twice", async () => {
  const run = () =>
    promisify(execFile)(process.execPath, ["quickstart.mjs"], {
      cwd: dir,
      env: { ...process.env, SLUICE_URL: server.url, SLUICE_TOKEN: TOKENS.agentA },
    });
  const first = await run();
  assert.match(first.stdout, /^m-\d+ t-\d+\n$/);
  const second = await run();
  assert.equal(second.stdout, first.stdout);
  const stats = (await (await fetch(`${upstream.url}/_stats`)).json()) as { emails: number; tickets: number };
  assert.equal(stats.emails, 1);
  assert.equal(stats.tickets, 1);
});
