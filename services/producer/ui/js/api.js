// The console's only way to the server: fetch with the bearer token from sessionStorage.
// The token is sent in the Authorization header and nowhere else (never a URL, cookie or log);
// requests carry no cookies (credentials: 'omit') and no referrer.

const TOKEN_KEY = 'sluice.token';

export function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

export function setToken(value) {
  sessionStorage.setItem(TOKEN_KEY, value);
}

export function clearToken() {
  sessionStorage.removeItem(TOKEN_KEY);
}

/** An API answer that is not 2xx, or no answer at all (status 0). */
export class ApiError extends Error {
  constructor(status, code, message, details) {
    super(message);
    this.status = status;
    this.code = code;
    this.details = details;
  }
}

/** The headers of an API request (the token's only way out). */
export function authHeaders(extra = {}) {
  const headers = { accept: 'application/json', ...extra };
  const t = token();
  if (t) headers.authorization = `Bearer ${t}`;
  return headers;
}

/** Calls the API; resolves to the decoded JSON body, or throws an ApiError. */
export async function api(path, { method = 'GET', body, signal } = {}) {
  const headers = authHeaders(body === undefined ? {} : { 'content-type': 'application/json' });
  let response;
  try {
    response = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      signal,
      credentials: 'omit',
      cache: 'no-store',
      referrerPolicy: 'no-referrer',
    });
  } catch (e) {
    if (e.name === 'AbortError') throw e;
    throw new ApiError(0, 'unreachable',
      'The Sluice server did not answer. Check that it is running and reachable, then retry.');
  }
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = null;
  }
  if (!response.ok) {
    const error = (data && data.error) || {};
    throw new ApiError(response.status, error.code || `http_${response.status}`,
      error.message || text || response.statusText, error.details);
  }
  return data;
}

const enc = encodeURIComponent;

/** Paths of the API routes the console uses; ids are percent-encoded as one segment each. */
export const paths = {
  whoami: () => '/v1/whoami',
  tools: () => '/v1/tools',
  overview: () => '/v1/overview',
  runs: (q) => `/v1/runs${query(q)}`,
  effects: (q) => `/v1/effects${query(q)}`,
  run: (run, q) => `/v1/runs/${enc(run)}/effects${query(q)}`,
  effect: (run, key) => `/v1/runs/${enc(run)}/effects/${enc(key)}`,
  action: (run, key, action) => `/v1/runs/${enc(run)}/effects/${enc(key)}:${action}`,
  rollback: (run) => `/v1/runs/${enc(run)}/rollback`,
  audit: (run) => `/v1/runs/${enc(run)}/audit`,
  verify: (run) => `/v1/runs/${enc(run)}/audit/verify`,
  stream: (run, summary) => `/v1/events/stream${query({ run_id: run, summary: summary ? 'true' : '' })}`,
};

/** `?a=1&b=2` of the defined, non-empty values of `q`. */
export function query(q = {}) {
  const parts = Object.entries(q)
    .filter(([, v]) => v !== undefined && v !== null && v !== '')
    .map(([k, v]) => `${enc(k)}=${enc(v)}`);
  return parts.length ? `?${parts.join('&')}` : '';
}

/** Pages of one listing followed at most: 50 pages read 50,000 runs. */
const MAX_PAGES = 50;

/**
 * Every effect matching `q`, following the listing's `next` cursor page by page: a queue
 * (BLOCKED, STUCK) must show the effects of old runs too, not those of the newest runs only.
 */
export async function allEffects(q) {
  const effects = [];
  let before;
  for (let page = 0; page < MAX_PAGES; page += 1) {
    const answer = await api(paths.effects({ ...q, before }));
    effects.push(...answer.effects);
    if (!answer.next) return effects;
    before = answer.next;
  }
  return effects;
}
