// Unit tests of the tool server's signature module, which the package does not export: these
// import the source (compiled beside the tests), where every other test imports the package by
// its name, `@sluice/client` — in scripts/suites/typescript-sdk.sh the npm tarball that
// scripts/release.sh packs, installed into build-test/ as a consumer would install it.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, test } from "node:test";

import { newSigningKey, parseSigningKeys, RequestRejected, SignatureVerifier } from "../../src/tool-server/signing.js";
import { REPO, signed } from "../harness.js";

const NEW = newSigningKey();

interface Vectors {
  signatures: { name: string; keys: string[]; webhook_signature: string }[];
}
const VECTORS = JSON.parse(readFileSync(join(REPO, "sdk/test-vectors/standard-webhooks.json"), "utf8")) as Vectors;

describe("the verifier", () => {
  test("the replay cache is bounded", () => {
    const verifier = new SignatureVerifier(parseSigningKeys([NEW], "test"), { maxRemembered: 2 });
    const headers = [0, 1, 2].map((n) => signed("{}", [NEW], { id: `id-${n}` }));
    for (const h of headers) {
      verifier.verify(h, Buffer.from("{}"));
    }
    assert.throws(() => verifier.verify(headers[2] ?? {}, Buffer.from("{}")), (e: unknown) => e instanceof RequestRejected && /already accepted/.test(e.message));
    // The oldest was forgotten to make room: the price of the bound. Only a holder of a key can
    // fill the cache (ids are remembered once their signature verified).
    assert.doesNotThrow(() => verifier.verify(headers[0] ?? {}, Buffer.from("{}")));
  });
});

describe("the keys", () => {
  test("each malformation is named", () => {
    const short = `whsec_${Buffer.from(Array.from({ length: 16 }, (_, i) => i)).toString("base64")}`;
    const cases: [string, RegExp][] = [
      ["MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", /does not start with whsec_/],
      ["whsec_MfKQ9r8GKYqr*wjUPD8ILPZIo2LaLaSw", /is not valid base64/],
      [short, /decodes to 16 bytes; a key needs at least 24/],
    ];
    for (const [key, named] of cases) {
      assert.throws(() => parseSigningKeys([key], "test"), named);
    }
  });

  for (const vector of VECTORS.signatures) {
    test(`every key of the shared vector is read: ${vector.name}`, () => {
      assert.equal(parseSigningKeys(vector.keys, "vectors").length, vector.webhook_signature.split(" ").length);
    });
  }
});
