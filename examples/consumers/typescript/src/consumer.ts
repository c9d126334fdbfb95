// React to Sluice's CONFIRMED and STUCK effects, read from the events topic.
//
// A stream consumer of Sluice's public event contract (docs/events.md): it subscribes to
// `<prefix>events` in a consumer group of its own, takes `dev.sluice.effect.confirmed.v1` and
// `dev.sluice.effect.stuck.v1`, validates each payload against the JSON Schema its
// `ce_dataschema` names (schemas/events/, draft 2020-12, with ajv), and ignores every other
// type. Delivery is at least once, so it deduplicates by `ce_id` before acting; kafkajs
// commits an offset only after `eachMessage` returned, so a crash redelivers rather than loses.
//
//   npm ci && npm run build
//   node dist/consumer.js --bootstrap 127.0.0.1:9092 --topic sluice.events --group billing
//
// Each handled event is printed as one JSON line ({"handled": ...}); a duplicate as
// {"duplicate": ...}. A real consumer keeps the ids it handled in its own store (a table with a
// unique key, written in the same transaction as its side effect); the Set here only lasts the
// process.

import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

import { Ajv2020 } from 'ajv/dist/2020.js';
import type { ValidateFunction } from 'ajv';
import addFormatsModule from 'ajv-formats';
import { Kafka, logLevel } from 'kafkajs';

const CONFIRMED = 'dev.sluice.effect.confirmed.v1';
const STUCK = 'dev.sluice.effect.stuck.v1';

/** The fields of an effect event this consumer reads (the schema has them all). */
interface EffectEvent {
  run_id: string;
  command_key: string;
  tool: string;
  status: string;
  external_ref?: string;
  last_error?: string;
  outcome: { decided_by?: string; attempts: number };
}

type Handler = (event: EffectEvent) => Record<string, unknown>;

const handlers: Record<string, Handler> = {
  // The effect committed: e.g. mark the order paid, with the upstream's reference.
  [CONFIRMED]: (event) => ({
    run_id: event.run_id,
    command_key: event.command_key,
    external_ref: event.external_ref,
    decided_by: event.outcome.decided_by,
  }),
  // Nobody could establish the outcome: e.g. open a ticket for a person.
  [STUCK]: (event) => ({
    run_id: event.run_id,
    command_key: event.command_key,
    last_error: event.last_error,
  }),
};

/** One validator per published schema, by its URL ($id): what ce_dataschema names. */
function validators(dir: string): Map<string, ValidateFunction> {
  const ajv = new Ajv2020({ strict: false, allErrors: true });
  // ajv-formats is CommonJS: under NodeNext its function is the default import's `default`.
  addFormatsModule.default(ajv);
  const out = new Map<string, ValidateFunction>();
  for (const name of readdirSync(dir).filter((n) => n.endsWith('.json')).sort()) {
    const schema = JSON.parse(readFileSync(join(dir, name), 'utf8')) as { $id: string };
    out.set(schema.$id, ajv.compile(schema));
  }
  return out;
}

async function main(): Promise<void> {
  const here = dirname(fileURLToPath(import.meta.url));
  const { values } = parseArgs({
    options: {
      bootstrap: { type: 'string', default: '127.0.0.1:9092' },
      topic: { type: 'string', default: 'sluice.events' },
      group: { type: 'string', default: 'example-typescript-consumer' },
      schemas: { type: 'string', default: resolve(here, '../../../../schemas/events') },
      'idle-exit': { type: 'string', default: '0' },
    },
  });
  const schemas = validators(values.schemas);
  const kafka = new Kafka({
    clientId: 'sluice-example-consumer',
    brokers: values.bootstrap.split(','),
    logLevel: logLevel.ERROR,
  });
  const consumer = kafka.consumer({ groupId: values.group });
  await consumer.connect();
  await consumer.subscribe({ topic: values.topic, fromBeginning: true });

  const handled = new Set<string>();
  let lastMessage = Date.now();
  await consumer.run({
    eachMessage: async ({ message }) => {
      lastMessage = Date.now();
      const headers: Record<string, string> = {};
      for (const [name, value] of Object.entries(message.headers ?? {})) {
        if (value !== undefined) headers[name] = value.toString();
      }
      const kind = headers.ce_type ?? '';
      const id = headers.ce_id ?? '';
      const handler = handlers[kind];
      if (!handler) return; // a type it does not act on
      if (handled.has(id)) {
        console.log(JSON.stringify({ duplicate: id, type: kind }));
        return;
      }
      const event: unknown = JSON.parse(message.value?.toString() ?? 'null');
      const validate = schemas.get(headers.ce_dataschema ?? '');
      if (!validate) throw new Error(`no published schema for ${headers.ce_dataschema}`);
      if (!validate(event)) {
        throw new Error(`payload off its contract: ${JSON.stringify(validate.errors)}`);
      }
      const result = handler(event as EffectEvent);
      handled.add(id);
      console.log(JSON.stringify({
        handled: kind,
        id,
        key: message.key?.toString(),
        traceparent: headers.traceparent,
        event,
        ...result,
      }));
    },
  });

  const idle = Number(values['idle-exit']) * 1000;
  if (idle > 0) {
    await new Promise<void>((done) => {
      const timer = setInterval(() => {
        if (Date.now() - lastMessage >= idle) {
          clearInterval(timer);
          done();
        }
      }, 200);
    });
    await consumer.disconnect();
  }
}

main().catch((error: unknown) => {
  console.error(error);
  process.exit(1);
});
