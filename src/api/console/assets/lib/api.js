// The public JSON API, as the console calls it: the same `/v1` routes and envelopes as any
// client. Errors become ApiError with the envelope's message and request id; changes carry
// the session's CSRF token.

let csrfToken = null;

/** The CSRF token of the browser's session (from `GET /console/session`). */
export function setCsrf(token) {
  csrfToken = token || null;
}

export class ApiError extends Error {
  constructor(status, type, message, requestId) {
    super(message);
    this.status = status;
    this.type = type;
    this.requestId = requestId;
  }
}

/** Sends a request; resolves to the parsed body (null when empty), or throws ApiError. */
export async function request(method, path, body) {
  const headers = { Accept: 'application/json' };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  if (method !== 'GET' && method !== 'HEAD' && csrfToken) headers['X-Keel-CSRF'] = csrfToken;
  let response;
  try {
    response = await fetch(path, {
      method,
      headers,
      credentials: 'same-origin',
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (error) {
    throw new ApiError(0, 'network', `The runtime cannot be reached: ${error.message}`, null);
  }
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = null;
  }
  if (!response.ok) {
    const envelope = data && data.error ? data.error : {};
    const error = new ApiError(response.status, envelope.type || 'http_error',
      envelope.message || `${response.status} ${response.statusText}`,
      envelope.request_id || response.headers.get('x-request-id'));
    if (response.status === 401) window.dispatchEvent(new CustomEvent('keel:unauthorized'));
    throw error;
  }
  return data;
}

export const get = (path) => request('GET', path);
export const post = (path, body) => request('POST', path, body);
export const del = (path) => request('DELETE', path);

/** `path` with the query parameters that have a value. */
export function withQuery(path, params) {
  const query = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value !== null && value !== undefined && value !== '') query.set(key, value);
  }
  const text = query.toString();
  return text ? `${path}?${text}` : path;
}

/** A path segment from an id. */
export const seg = encodeURIComponent;

/** Cursor pagination over a list route: next follows `next_cursor`, previous goes back
 *  through the cursors already seen. */
export class Pager {
  constructor(path, params = {}, limit = 20) {
    this.path = path;
    this.params = params;
    this.limit = limit;
    this.cursors = [null];
    this.page = null;
  }

  async load() {
    const cursor = this.cursors[this.cursors.length - 1];
    this.page = await get(withQuery(this.path, { ...this.params, limit: this.limit, cursor }));
    return this.page;
  }

  hasNext() {
    return Boolean(this.page && this.page.has_more && this.page.next_cursor);
  }

  hasPrevious() {
    return this.cursors.length > 1;
  }

  next() {
    if (this.hasNext()) this.cursors.push(this.page.next_cursor);
    return this.load();
  }

  previous() {
    if (this.hasPrevious()) this.cursors.pop();
    return this.load();
  }

  /** The page number shown to people, from 1. */
  number() {
    return this.cursors.length;
  }
}
