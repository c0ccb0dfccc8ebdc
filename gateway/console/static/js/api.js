// Calls to the server: every request carries the API key (or, for the repository API, the admin key) in the
// Authorization header. Keys live in this module's memory; the API key goes to sessionStorage only when the user
// ticks "remember in this tab". Neither is ever put in a URL.

const REMEMBER = "switchyard-console-api-key";

const keys = {
  api: sessionStorage.getItem(REMEMBER) || "",
  admin: "",
};
const listeners = new Set();
let askKey = null; // set by main.js: async (message) => boolean (true if a key was entered)
let pendingAsk = null; // one dialog at a time, shared by concurrent 401s
let declined = false; // the user closed the dialog without a key: polls do not ask again until one is set

export class ApiError extends Error {
  constructor(status, message, body) {
    super(message);
    this.status = status;
    this.body = body;
  }
}

export function onKeysChanged(fn) { listeners.add(fn); }
function changed() { for (const fn of listeners) fn({ api: Boolean(keys.api), admin: Boolean(keys.admin) }); }

export function setApiKey(key, remember) {
  keys.api = key || "";
  declined = false;
  if (remember && keys.api) sessionStorage.setItem(REMEMBER, keys.api);
  else sessionStorage.removeItem(REMEMBER);
  changed();
}
export function setAdminKey(key) { keys.admin = key || ""; changed(); }
export function hasApiKey() { return Boolean(keys.api); }
export function hasAdminKey() { return Boolean(keys.admin); }
export function setKeyPrompt(fn) { askKey = fn; }

/** The error message of a response body in OpenAI's shape ({"error": {"message"}}) or KServe's ({"error": "..."}). */
export function errorMessage(body, status) {
  if (body && typeof body === "object") {
    const err = body.error;
    if (typeof err === "string") return err;
    if (err && typeof err.message === "string") return err.message;
    if (typeof body.detail === "string") return body.detail;
  }
  if (typeof body === "string" && body.trim()) return body.trim().slice(0, 300);
  return `HTTP ${status}`;
}

async function readError(response) {
  const text = await response.text();
  let body = text;
  try { body = JSON.parse(text); } catch { /* not JSON */ }
  return new ApiError(response.status, errorMessage(body, response.status), body);
}

async function promptForKey(message) {
  if (!askKey || declined) return false;
  if (!pendingAsk) {
    pendingAsk = askKey(message).then((entered) => { declined = !entered; return entered; })
      .finally(() => { pendingAsk = null; });
  }
  return pendingAsk;
}

/**
 * fetch() with the right key. `admin: true` sends the admin key (repository API); otherwise a 401 asks the user
 * for an API key once and retries. Resolves to the Response when it is OK, else rejects with ApiError.
 */
export async function request(path, { method = "GET", body, admin = false, headers = {}, signal, ask = true } = {}) {
  for (let attempt = 0; ; attempt++) {
    const h = { ...headers };
    const key = admin ? keys.admin : keys.api;
    if (key) h.Authorization = `Bearer ${key}`;
    if (body !== undefined) h["Content-Type"] = "application/json";
    const response = await fetch(path, {
      method, headers: h, signal, cache: "no-store", credentials: "omit",
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    if (response.ok) return response;
    if (response.status === 401 && !admin && ask && attempt === 0) {
      const message = keys.api ? "The server did not accept this API key; enter another." :
        "This server needs an API key; the page sends it with every call it makes.";
      if (await promptForKey(message)) continue;
    }
    throw await readError(response);
  }
}

export async function getJSON(path, options) { return (await request(path, options)).json(); }
export async function postJSON(path, body, options = {}) {
  return (await request(path, { ...options, method: "POST", body })).json();
}

/**
 * POST a streaming request and call onEvent(data) for each server-sent event's JSON payload, until [DONE].
 * EventSource cannot POST or send headers, so the stream is read from fetch's body.
 */
export async function streamSSE(path, body, onEvent, { signal, headers } = {}) {
  const response = await request(path, { method: "POST", body, signal, headers });
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value;
    let cut;
    while ((cut = buffer.search(/\r?\n\r?\n/)) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut).replace(/^\r?\n\r?\n/, "");
      const data = block.split(/\r?\n/).filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart()).join("\n");
      if (!data) continue;
      if (data === "[DONE]") return;
      let payload;
      try { payload = JSON.parse(data); } catch { continue; }
      if (payload && payload.error) throw new ApiError(response.status, errorMessage(payload, response.status), payload);
      onEvent(payload);
    }
  }
}
