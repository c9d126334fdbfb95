// Checks that src/generated/openapi.ts is what openapi-typescript makes of schemas/openapi.yaml
// today: regenerates it into a temporary file with the same command as `npm run generate` and
// compares. Exits 1 naming the first differing line, so a stale commit fails the suite.
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

const root = fileURLToPath(new URL("..", import.meta.url));
const committed = join(root, "src/generated/openapi.ts");
const dir = mkdtempSync(join(tmpdir(), "sluice-openapi-"));
const fresh = join(dir, "openapi.ts");
try {
  execFileSync(
    process.execPath,
    [
      join(root, "node_modules/openapi-typescript/bin/cli.js"),
      join(root, "../../schemas/openapi.yaml"),
      "--empty-objects-unknown",
      "-o",
      fresh,
    ],
    { stdio: ["ignore", "ignore", "inherit"] },
  );
  const want = readFileSync(fresh, "utf8").split("\n");
  const have = readFileSync(committed, "utf8").split("\n");
  const line = want.findIndex((text, i) => text !== have[i]);
  if (line === -1 && want.length === have.length) {
    console.log("src/generated/openapi.ts is current with schemas/openapi.yaml");
  } else {
    const at = line === -1 ? Math.min(want.length, have.length) : line;
    console.error(
      `src/generated/openapi.ts is stale: line ${at + 1} is\n  ${have[at] ?? "(end of file)"}\n` +
        `but schemas/openapi.yaml now gives\n  ${want[at] ?? "(end of file)"}\n` +
        "Run `npm run generate` in sdk/typescript and commit the result.",
    );
    process.exitCode = 1;
  }
} finally {
  rmSync(dir, { recursive: true, force: true });
}
