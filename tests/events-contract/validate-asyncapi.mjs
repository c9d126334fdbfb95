// Parses schemas/asyncapi.yaml with the AsyncAPI parser (@asyncapi/parser, which validates the
// document against the AsyncAPI 3.0 schema and resolves its $refs to schemas/events/), and
// checks that every public event type has its message on the events topic and on the webhook
// channel. Prints one JSON line per check: {"check": ..., "ok": true|false, "detail": ...}.
import { readdirSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

import { Parser, fromFile } from '@asyncapi/parser';

// The repository: the first argument (the suite runs a copy of this file beside its
// node_modules in ~/.cache/sluice), else where this file is.
const root = resolve(process.argv[2] ?? resolve(dirname(fileURLToPath(import.meta.url)), '../..'));
const file = resolve(root, 'schemas/asyncapi.yaml');
const report = (check, ok, detail = '') => console.log(JSON.stringify({ check, ok, detail }));

const parser = new Parser();
const { document, diagnostics } = await fromFile(parser, file).parse();
// Severity 0 is an error; 1 a warning (reported, not failed), 2 info, 3 hint.
const errors = diagnostics.filter((d) => d.severity === 0);
for (const d of diagnostics.filter((d) => d.severity === 1)) {
  console.error(`warning: ${d.code}: ${d.message} at ${d.path.join('/')}`);
}
report('asyncapi document parses and validates', document !== undefined && errors.length === 0,
  errors.map((d) => `${d.code}: ${d.message} at ${d.path.join('/')}`).join('; '));
if (!document) process.exit(0);

const types = readdirSync(resolve(root, 'schemas/events'))
  .filter((n) => n.endsWith('.json'))
  .map((n) => n.replace(/\.json$/, ''))
  .sort();
const names = (channel) => document.channels().get(channel)?.messages().all().map((m) => m.name()).sort() ?? [];
report('every event type is a message of the events topic',
  JSON.stringify(names('events')) === JSON.stringify(types), `${names('events')}`);
report('every event type is a message of the webhook deliveries',
  JSON.stringify(names('webhook')) === JSON.stringify(types), `${names('webhook')}`);
const confirmed = document.channels().get('events').messages().all()
  .find((m) => m.name() === 'dev.sluice.effect.confirmed.v1');
const properties = confirmed?.payload()?.properties() ?? {};
report('payload schemas are resolved from schemas/events',
  ['run_id', 'status', 'outcome', 'external_ref'].every((p) => p in properties),
  Object.keys(properties).join(','));
const headers = confirmed?.headers()?.properties() ?? {};
report('the Kafka headers name the trace context and the dataschema',
  ['traceparent', 'ce_traceparent', 'ce_dataschema', 'ce_id', 'ce_type'].every((h) => h in headers),
  Object.keys(headers).join(','));
