/**
 * `ToolServer`: plain async functions served as an upstream that speaks Sluice's tool wire
 * contract (docs/architecture.md, "Wire contract"; the client side is
 * shared/connector/src/classify.rs), as a request listener for Node's `http`.
 *
 * | call | route | answers |
 * |---|---|---|
 * | dispatch | `POST /<ns>/<name>` | 201 the result; a replay of the key: the stored answer; a replay while the first still runs: 409 (declared `in_progress_status`, so ambiguous); the key with other arguments: 422; `ToolRefusal`: its 4xx, stored; any other error: 500, not stored |
 * | status check | `GET /<ns>/<name>/by-key/<business key>` | 200 the one effect; 404 none; 409 several, `{"id", "refs"}`; an error: 503 (inconclusive) |
 * | compensate | `POST /<ns>/<name>/compensate` with `{"args", "external_ref"}` | 200 the undo's result, once per compensation key (replays answered from the store); `ToolRefusal`: its 4xx (impossible); any other error: 500 (retried) |
 *
 * Every request, on every route, must first be a call signed by Sluice (Standard Webhooks,
 * ./signing.ts): an unsigned or badly signed one, one whose timestamp is more than 5 minutes
 * off, or a replayed one is answered 401 `{"error": …}` before its body is parsed or any
 * function runs. Every dispatch and compensate needs its `Idempotency-Key` header; the others
 * (`X-Sluice-Run-Id`, `X-Sluice-Command-Key`, `X-Sluice-Business-Key`,
 * `X-Sluice-Dispatch-Idempotency-Key`) are handed to the functions.
 */

import type { IncomingMessage, ServerResponse } from "node:http";

import {
  type CallContext,
  catalogEntry,
  checkDefinition,
  credentialTable,
  DEFAULT_CREDENTIAL,
  type ToolDefinition,
  ToolRefusal,
} from "./definition.js";
import { parseSigningKeys, RequestRejected, SIGNING_KEYS_ENV, SignatureVerifier } from "./signing.js";
import { fingerprint, type IdempotencyStore, MemoryStore, type StoredAnswer } from "./store.js";
import { DefinitionError, SigningKeyError } from "../errors.js";

/** The most a request body may hold. */
const MAX_BODY_BYTES = 1 << 20;

/** Options of a {@link ToolServer}. */
export interface ToolServerOptions {
  /** Where idempotency keys and their answers are kept (default: a {@link MemoryStore}). */
  store?: IdempotencyStore;
  /**
   * The `whsec_` keys Sluice signs its calls with (a list, or one string of whitespace-separated
   * keys); default: the `SLUICE_TOOL_SIGNING_KEYS` variable. Each request must carry a
   * signature by one of them (during a rotation, list both).
   */
  signingKeys?: readonly string[] | string;
  /**
   * With no key at all, serve anyone who can reach the server instead of refusing to be built:
   * for a local experiment only (a warning is emitted). A key given always wins.
   */
  allowUnsigned?: boolean;
}

/** Where {@link ToolServer.catalogToml} tells Sluice to find the keys it signs with. */
export interface CatalogOptions {
  /**
   * The credential's name (default `tool_services`). A server built with `allowUnsigned` and no
   * key prints none unless one is named. Two servers in one catalog each print their
   * credential: give them different names.
   */
  credential?: string;
  /** The variable holding the whitespace-separated `whsec_` keys (default `SLUICE_TOOL_SIGNING_KEYS`). */
  keysEnv?: string;
  /** A file holding them instead of a variable. */
  keysFile?: string;
}

type AnyTool = ToolDefinition<Record<string, unknown>, unknown>;

/** A set of tools served over HTTP with the wire contract's replay, lookup and undo. */
export class ToolServer {
  readonly #tools = new Map<string, AnyTool>();
  readonly #store: IdempotencyStore;
  readonly #verifier: SignatureVerifier | undefined;

  /**
   * @throws {SigningKeyError} no signing key and no `allowUnsigned`, or a malformed key
   */
  constructor(options: ToolServerOptions = {}) {
    this.#store = options.store ?? new MemoryStore();
    const given = options.signingKeys;
    const keys = (typeof given === "string" ? given : (given?.join(" ") ?? process.env[SIGNING_KEYS_ENV] ?? ""))
      .split(/\s+/)
      .filter((key) => key !== "");
    if (keys.length > 0) {
      const source = given === undefined ? `the ${SIGNING_KEYS_ENV} environment variable` : "signingKeys";
      this.#verifier = new SignatureVerifier(parseSigningKeys(keys, source));
    } else if (options.allowUnsigned) {
      process.emitWarning(
        "ToolServer({ allowUnsigned: true }) with no signing key: anyone who can reach this server can " +
          `call its tools (create, refund, read effects). For a local experiment only; set ${SIGNING_KEYS_ENV} ` +
          "anywhere else.",
        { code: "SLUICE_UNSIGNED_TOOL_SERVER" },
      );
    } else {
      const why = given === undefined ? `${SIGNING_KEYS_ENV} is not set` : "signingKeys is empty";
      throw new SigningKeyError(
        `ToolServer has no signing key (${why}), so it cannot tell Sluice's calls from anyone else's. ` +
          `Set ${SIGNING_KEYS_ENV} to the whsec_ keys Sluice signs with (whitespace-separated; ` +
          "newSigningKey() makes one), or pass signingKeys: [...]; or, for a local experiment only, " +
          "pass allowUnsigned: true.",
      );
    }
  }

  /** Whether requests must be signed (false only when built with `allowUnsigned` and no key). */
  get verifiesSignatures(): boolean {
    return this.#verifier !== undefined;
  }

  /**
   * Adds a tool.
   *
   * @throws {DefinitionError} a name already served, or a definition Sluice could not run
   *   safely (see {@link checkDefinition})
   */
  define<Args extends Record<string, unknown>, Result>(tool: ToolDefinition<Args, Result>): this {
    checkDefinition(tool);
    if (this.#tools.has(tool.name)) {
      throw new DefinitionError(tool.name, `tool ${tool.name} is already defined on this server`);
    }
    // The functions receive what the contract sends, which Sluice validated against the
    // schema the tool declared.
    this.#tools.set(tool.name, tool as unknown as AnyTool);
    return this;
  }

  /**
   * The catalog TOML pointing Sluice at this server at `baseUrl`, to paste into the catalog: the
   * credential Sluice signs with (`[credentials.<name>]`), then every tool's entry naming it. No
   * key's value is ever printed.
   */
  catalogToml(baseUrl: string, options: CatalogOptions = {}): string {
    const { keysEnv, keysFile } = options;
    if (keysEnv !== undefined && keysFile !== undefined) {
      throw new TypeError("Sluice reads the keys from keysEnv or keysFile, not both");
    }
    const asked = this.verifiesSignatures || keysEnv !== undefined || keysFile !== undefined;
    const credential = options.credential ?? (asked ? DEFAULT_CREDENTIAL : undefined);
    const entries = [...this.#tools.values()].map((tool) => catalogEntry(tool, baseUrl, credential));
    if (credential !== undefined) {
      const source = keysFile !== undefined ? { file: keysFile } : { env: keysEnv ?? SIGNING_KEYS_ENV };
      entries.unshift(credentialTable(credential, source));
    }
    return entries.join("\n");
  }

  /** The request listener: `http.createServer(tools.handler)`. */
  readonly handler = (request: IncomingMessage, response: ServerResponse): void => {
    this.#handle(request).then(
      (answer) => send(response, answer),
      (error: unknown) => send(response, { status: 500, body: { error: String(error) } }),
    );
  };

  async #handle(request: IncomingMessage): Promise<StoredAnswer> {
    // Verified before anything else, on every route: an unsigned request is refused before its
    // body is even read, a badly signed one before it is parsed or any function runs.
    const verifier = this.#verifier;
    const refuse = (rejected: RequestRejected): StoredAnswer => ({ status: 401, body: { error: rejected.message } });
    try {
      verifier?.checkHeaders(request.headers);
    } catch (error) {
      if (error instanceof RequestRejected) {
        return refuse(error);
      }
      throw error;
    }
    const body = await readBody(request);
    if (body === undefined) {
      return { status: 413, body: { error: `the body is over ${MAX_BODY_BYTES} bytes` } };
    }
    try {
      verifier?.verify(request.headers, body);
    } catch (error) {
      if (error instanceof RequestRejected) {
        return refuse(error);
      }
      throw error;
    }
    const path = new URL(request.url ?? "/", "http://tool.invalid").pathname;
    const segments = path.split("/").slice(1).map(decodeURIComponent);
    const [namespace, name, operation, key, ...rest] = segments;
    const tool = this.#tools.get(`${namespace}/${name}`);
    if (tool === undefined || rest.length > 0) {
      return { status: 404, body: { error: `no tool route ${path}` } };
    }
    const call = callContext(request);
    if (call === undefined) {
      return { status: 400, body: { error: "the Idempotency-Key header is required" } };
    }
    if (operation === undefined && request.method === "POST") {
      return this.#dispatch(tool, call, parseJson(body));
    }
    if (operation === "by-key" && key !== undefined && request.method === "GET") {
      return this.#statusCheck(tool, key, call);
    }
    if (operation === "compensate" && key === undefined && request.method === "POST") {
      return this.#compensate(tool, call, parseJson(body));
    }
    return { status: 404, body: { error: `no route ${request.method} ${path}` } };
  }

  async #dispatch(tool: AnyTool, call: CallContext, args: unknown): Promise<StoredAnswer> {
    if (!isObject(args)) {
      return { status: 400, body: { error: "the body must be the arguments as a JSON object" } };
    }
    return this.#once(`dispatch:${tool.name}:${call.idempotencyKey}`, args, async () => ({
      status: 201,
      body: await tool.dispatch(args, call),
    }));
  }

  async #statusCheck(tool: AnyTool, businessKey: string, call: CallContext): Promise<StoredAnswer> {
    if (tool.statusCheck === undefined) {
      return { status: 404, body: { error: `${tool.name} declares no status check` } };
    }
    let found: unknown;
    try {
      found = await tool.statusCheck(businessKey, call);
    } catch (error) {
      return { status: 503, body: { error: `lookup failed: ${String(error)}` } };
    }
    const effects = found === null || found === undefined ? [] : Array.isArray(found) ? found : [found];
    if (effects.length === 0) {
      return { status: 404, body: { error: `no effect has business key ${businessKey}` } };
    }
    if (effects.length === 1) {
      return { status: 200, body: effects[0] };
    }
    const refs = effects.map(reference);
    return {
      status: 409,
      body: { error: `${effects.length} effects have business key ${businessKey}`, id: refs[0], refs },
    };
  }

  async #compensate(tool: AnyTool, call: CallContext, body: unknown): Promise<StoredAnswer> {
    const compensate = tool.compensate;
    if (compensate === undefined) {
      return { status: 404, body: { error: `${tool.name} declares no compensate` } };
    }
    if (!isObject(body) || !isObject(body["args"])) {
      return { status: 400, body: { error: 'the body must be {"args": {…}, "external_ref": …}' } };
    }
    const externalRef = typeof body["external_ref"] === "string" ? body["external_ref"] : null;
    const request = { args: body["args"], externalRef };
    return this.#once(`compensate:${tool.name}:${call.idempotencyKey}`, body, async () => ({
      status: 200,
      body: (await compensate(request, call)) ?? { external_ref: externalRef, compensated: true },
    }));
  }

  /**
   * Runs `work` once per `key`: a replay gets the stored answer, a replay while the first
   * runs gets 409, the key with another request 422. Refusals are stored like results;
   * other errors release the key so a retry runs again.
   */
  async #once(key: string, request: unknown, work: () => Promise<StoredAnswer>): Promise<StoredAnswer> {
    const print = fingerprint(request);
    const stored = await this.#store.begin(key, print);
    if (stored !== undefined) {
      if (stored.fingerprint !== print) {
        return {
          status: 422,
          body: { error: "this Idempotency-Key was used with another request; a key names one request" },
        };
      }
      return (
        stored.answer ?? {
          status: 409,
          body: { error: "a request with this Idempotency-Key is still in progress" },
        }
      );
    }
    let answer: StoredAnswer;
    try {
      answer = await work();
    } catch (error) {
      if (error instanceof ToolRefusal) {
        answer = { status: error.status, body: { error: error.message } };
      } else {
        await this.#store.abandon(key);
        return { status: 500, body: { error: `the tool failed: ${String(error)}` } };
      }
    }
    await this.#store.finish(key, answer);
    return answer;
  }
}

/** The contract's headers, or `undefined` without an `Idempotency-Key`. */
function callContext(request: IncomingMessage): CallContext | undefined {
  const text = (name: string): string | undefined => {
    const value = request.headers[name];
    return typeof value === "string" ? value : undefined;
  };
  const idempotencyKey = text("idempotency-key");
  return idempotencyKey === undefined
    ? undefined
    : {
        idempotencyKey,
        runId: text("x-sluice-run-id"),
        commandKey: text("x-sluice-command-key"),
        businessKey: text("x-sluice-business-key"),
        dispatchIdempotencyKey: text("x-sluice-dispatch-idempotency-key"),
      };
}

/** A result's external reference: its `id`, as the catalog's default `reference_pointer`. */
function reference(effect: unknown): string | undefined {
  const id = isObject(effect) ? effect["id"] : undefined;
  return typeof id === "string" || typeof id === "number" ? String(id) : undefined;
}

/** The raw body (signed as received), or `undefined` past {@link MAX_BODY_BYTES}. */
async function readBody(request: IncomingMessage): Promise<Buffer | undefined> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of request) {
    const buffer = chunk as Buffer;
    size += buffer.length;
    if (size > MAX_BODY_BYTES) {
      return undefined;
    }
    chunks.push(buffer);
  }
  return Buffer.concat(chunks);
}

function parseJson(body: Buffer): unknown {
  try {
    return JSON.parse(body.toString("utf8")) as unknown;
  } catch {
    return undefined;
  }
}

function send(response: ServerResponse, answer: StoredAnswer): void {
  const body = answer.body === undefined ? "" : JSON.stringify(answer.body);
  response.writeHead(answer.status, {
    "content-type": "application/json",
    "content-length": Buffer.byteLength(body),
  });
  response.end(body);
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}
