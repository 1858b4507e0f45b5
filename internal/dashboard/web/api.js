// Calls from the page: the platform API under /dashboard/api (the session
// cookie stands for the credential) and a sandbox's envd under
// /dashboard/envd/{id}. Every call carries the dashboard's CSRF header.
export class APIError extends Error {
  constructor(status, message) { super(message); this.status = status }
}

const csrf = { 'X-Warren-Dashboard': '1' }

async function failure(res) {
  let msg = `${res.status} ${res.statusText}`
  try {
    const body = await res.json()
    if (body && body.message) msg = body.message
  } catch { /* not JSON: keep the status */ }
  if (res.status === 401 && res.headers.get('X-Warren-Session') === 'none') window.dispatchEvent(new CustomEvent('warren:signedout', { detail: msg }))
  return new APIError(res.status, msg)
}

export async function call(method, path, body, prefix = '/dashboard/api', withHeaders = false) {
  const init = { method, headers: { ...csrf }, credentials: 'same-origin' }
  if (body !== undefined) {
    init.headers['Content-Type'] = 'application/json'
    init.body = JSON.stringify(body)
  }
  const res = await fetch(prefix + path, init)
  if (!res.ok) throw await failure(res)
  if (res.status === 204) return null
  const text = await res.text()
  const data = text ? JSON.parse(text) : null
  return withHeaders ? { data, headers: res.headers } : data
}

// send calls the API with a raw body (a file's bytes), not JSON.
export async function send(method, path, body) {
  const res = await fetch('/dashboard/api' + path, {
    method, credentials: 'same-origin', headers: { ...csrf, 'Content-Type': 'application/octet-stream' }, body,
  })
  if (!res.ok) throw await failure(res)
}

// pages reads a paginated list (X-Next-Token), at most maxPages pages.
export async function pages(path, maxPages = 20) {
  const out = []
  let token = ''
  for (let i = 0; i < maxPages; i++) {
    const sep = path.includes('?') ? '&' : '?'
    const { data, headers } = await call('GET', path + (token ? `${sep}nextToken=${encodeURIComponent(token)}` : ''), undefined, '/dashboard/api', true)
    out.push(...(data || []))
    token = headers.get('X-Next-Token')
    if (!token) break
  }
  return out
}

export const api = {
  get: (p) => call('GET', p),
  post: (p, b) => call('POST', p, b ?? {}),
  del: (p) => call('DELETE', p),
  patch: (p, b) => call('PATCH', p, b),
}

export const session = {
  get: () => call('GET', '', undefined, '/dashboard/session'),
  signIn: (key) => call('POST', '', { key }, '/dashboard/session'),
  signOut: () => call('DELETE', '', undefined, '/dashboard/session'),
}

// envd: Connect RPC (JSON) and /files, as the sandbox's default user.
const user = 'user'
const basic = { Authorization: 'Basic ' + btoa(user + ':') }

export function envdURL(id, path) { return `/dashboard/envd/${encodeURIComponent(id)}${path}` }

export async function rpc(id, method, msg) {
  const res = await fetch(envdURL(id, '/' + method), {
    method: 'POST', credentials: 'same-origin',
    headers: { ...csrf, ...basic, 'Content-Type': 'application/json', 'Connect-Protocol-Version': '1' },
    body: JSON.stringify(msg),
  })
  if (!res.ok) throw await failure(res)
  return res.json()
}

// stream calls a server-streaming Connect method and hands each message
// to onMessage until the stream ends or signal aborts.
export async function stream(id, method, msg, onMessage, signal) {
  const json = new TextEncoder().encode(JSON.stringify(msg))
  const env = new Uint8Array(5 + json.length)
  new DataView(env.buffer).setUint32(1, json.length)
  env.set(json, 5)
  const res = await fetch(envdURL(id, '/' + method), {
    method: 'POST', credentials: 'same-origin', signal,
    headers: { ...csrf, ...basic, 'Content-Type': 'application/connect+json', 'Connect-Protocol-Version': '1' },
    body: env,
  })
  if (!res.ok) throw await failure(res)
  const reader = res.body.getReader()
  let buf = new Uint8Array(0)
  for (;;) {
    const { value, done } = await reader.read()
    if (done) return
    const next = new Uint8Array(buf.length + value.length)
    next.set(buf); next.set(value, buf.length); buf = next
    while (buf.length >= 5) {
      const flags = buf[0]
      const len = new DataView(buf.buffer, buf.byteOffset + 1, 4).getUint32(0)
      if (buf.length < 5 + len) break
      const body = JSON.parse(new TextDecoder().decode(buf.subarray(5, 5 + len)) || '{}')
      buf = buf.slice(5 + len)
      if (flags & 2) {
        if (body.error) throw new APIError(500, body.error.message || body.error.code)
        return
      }
      onMessage(body)
    }
  }
}

export async function readFile(id, path) {
  const res = await fetch(envdURL(id, `/files?path=${encodeURIComponent(path)}&username=${user}`), { headers: { ...csrf }, credentials: 'same-origin' })
  if (!res.ok) throw await failure(res)
  return res.blob()
}

export async function writeFile(id, path, blob) {
  const res = await fetch(envdURL(id, `/files?path=${encodeURIComponent(path)}&username=${user}`), {
    method: 'POST', credentials: 'same-origin', headers: { ...csrf, 'Content-Type': 'application/octet-stream' }, body: blob,
  })
  if (!res.ok) throw await failure(res)
}
