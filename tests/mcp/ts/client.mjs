// One MCP client session of the official TypeScript SDK (@modelcontextprotocol/sdk, pinned in
// package.json) against `sluice mcp`: connects (streamable HTTP with a bearer token, or stdio by
// starting the server), lists the tools, makes the calls given, and prints one JSON line with
// what it saw. tests/mcp/test_typescript.py drives it and checks the answers against Sluice.
//
// usage: node client.mjs <config JSON>
//   {"transport": "http", "url": "...", "token": "...", "calls": [{"name", "arguments", "meta"}]}
//   {"transport": "stdio", "command": "...", "args": [...], "env": {...}, "calls": [...]}
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const config = JSON.parse(process.argv[2]);
const transport =
  config.transport === "http"
    ? new StreamableHTTPClientTransport(new URL(config.url), {
        requestInit: { headers: { Authorization: `Bearer ${config.token}` } },
      })
    : new StdioClientTransport({ command: config.command, args: config.args, env: config.env });
const client = new Client({ name: "sluice-mcp-ts-test", version: "1.0.0" });
await client.connect(transport);
const seen = {
  protocolVersion: transport.protocolVersion ?? null,
  sessionId: transport.sessionId ?? null,
  tools: (await client.listTools()).tools.map((tool) => tool.name),
  results: [],
};
for (const call of config.calls) {
  const result = await client.callTool({ name: call.name, arguments: call.arguments, _meta: call.meta });
  seen.results.push({ isError: result.isError ?? false, structured: result.structuredContent ?? null });
}
if (config.transport === "http") {
  await transport.terminateSession();
}
await client.close();
process.stdout.write(`${JSON.stringify(seen)}\n`);
