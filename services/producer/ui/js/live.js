// Live updates: reads GET /v1/events/stream with fetch and a streaming body reader (EventSource
// cannot send an Authorization header, and the token must never go into a URL), parses the
// server-sent events, and reconnects with backoff while the view is open.

import { authHeaders, paths } from './api.js';

/**
 * Opens the event stream of `run` (or of every run the caller may read when `run` is empty).
 * `onEvent(event)` gets each lifecycle event's data (the public projection of the command:
 * `run_id`, `command_key`, `status`, … — docs/events.md); `onEvent(null)` means something
 * changed or events were missed, and the view should re-read. Without a run the stream is a
 * summary (at most one change notice a second), so a busy system's every command does not
 * cross the network. `onState` gets 'live', 'reconnecting' or 'off'. Returns a function that
 * closes the stream.
 */
export function watch(run, onEvent, onState = () => {}) {
  const controller = new AbortController();
  let delay = 500;
  let stopped = false;

  async function connect() {
    while (!stopped) {
      try {
        const response = await fetch(paths.stream(run, !run), {
          headers: authHeaders({ accept: 'text/event-stream' }),
          credentials: 'omit',
          cache: 'no-store',
          signal: controller.signal,
        });
        if (response.status === 401 || response.status === 403 || response.status === 422) {
          onState('off', response.status);
          return;
        }
        if (!response.ok || !response.body) throw new Error(`stream answered ${response.status}`);
        delay = 500;
        await read(response.body, (type, data) => {
          if (type === 'ready') onState('live');
          else if (type === 'effect') onEvent(JSON.parse(data));
          else if (type === 'lagged' || type === 'changed') onEvent(null);
        });
      } catch (e) {
        if (stopped || e.name === 'AbortError') return;
      }
      if (stopped) return;
      onState('reconnecting');
      // Missed events while away: the view re-reads once connected again.
      onEvent(null);
      await new Promise((r) => setTimeout(r, delay));
      delay = Math.min(delay * 2, 15000);
    }
  }

  connect();
  return () => {
    stopped = true;
    controller.abort();
    onState('off');
  };
}

/** Reads a text/event-stream body, calling `emit(type, data)` per event. */
async function read(body, emit) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value.replace(/\r\n?/g, '\n');
    let end;
    while ((end = buffer.indexOf('\n\n')) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let type = 'message';
      const data = [];
      for (const line of block.split('\n')) {
        if (line.startsWith(':')) continue;
        const at = line.indexOf(':');
        const field = at < 0 ? line : line.slice(0, at);
        const text = at < 0 ? '' : line.slice(at + 1).replace(/^ /, '');
        if (field === 'event') type = text;
        else if (field === 'data') data.push(text);
      }
      if (data.length) emit(type, data.join('\n'));
    }
  }
}
