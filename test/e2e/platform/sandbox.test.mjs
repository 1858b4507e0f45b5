// The SDK, configured as a user configures it (E2B_API_URL, E2B_SANDBOX_URL,
// E2B_API_KEY), drives a real `warren serve`: sandboxes are real runsc
// sandboxes, and every envd call goes through Warren's proxy.
import { afterAll, describe, expect, inject, test } from 'vitest'
import { Sandbox, AuthenticationError, NotFoundError, SandboxNotFoundError, SandboxError } from 'e2b'
import http from 'node:http'

const w = inject('warren')
const made = []

async function create(opts = {}) {
  const sbx = await Sandbox.create(opts)
  made.push(sbx.sandboxId)
  return sbx
}

afterAll(async () => {
  for (const id of made) await Sandbox.kill(id).catch(() => {})
})

// rawGet sends a GET to the proxy with the given headers (Host included),
// which fetch does not allow to set.
function rawGet(path, headers) {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port: w.proxyPort, path, headers, agent: false }, (res) => {
      let body = ''
      res.setEncoding('utf8')
      res.on('data', (d) => { body += d })
      res.on('end', () => resolve({ status: res.statusCode, body }))
    })
    req.on('error', reject)
    req.end()
  })
}

describe('create and inspect', () => {
  test('default template, metadata and envs; getInfo has every field', async () => {
    const before = Date.now()
    const sbx = await create({ metadata: { owner: 'e2e', 'a b': 'c&d=e' }, envs: { GREETING: 'hello' } })
    expect(sbx.sandboxId).toMatch(/^[a-z0-9]{20}$/)
    const info = await sbx.getInfo()
    expect(info.sandboxId).toBe(sbx.sandboxId)
    expect(info.templateId).toBe('base')
    expect(info.name).toBe('base')
    expect(info.metadata).toEqual({ owner: 'e2e', 'a b': 'c&d=e' })
    expect(info.state).toBe('running')
    expect(info.cpuCount).toBeGreaterThanOrEqual(1)
    expect(info.memoryMB).toBeGreaterThanOrEqual(128)
    expect(info.envdVersion).toBe('0.6.4')
    expect(info.startedAt.getTime()).toBeGreaterThanOrEqual(before - 1000)
    // SDK 2.51 sends no timeout: the v2 default is 300 s.
    const ttl = info.endAt.getTime() - info.startedAt.getTime()
    expect(ttl).toBeGreaterThan(299_000)
    expect(ttl).toBeLessThan(301_000)
    const r = await sbx.commands.run('echo $GREETING $E2B_SANDBOX_ID; whoami; hostname')
    expect(r.stdout).toBe(`hello ${sbx.sandboxId}\nuser\n${sbx.sandboxId}\n`)
  })

  test('a given template and timeout', async () => {
    const sbx = await create({ template: 'base', timeoutMs: 60_000 })
    const info = await sbx.getInfo()
    expect(info.templateId).toBe('base')
    const ttl = info.endAt.getTime() - info.startedAt.getTime()
    expect(ttl).toBeGreaterThan(59_000)
    expect(ttl).toBeLessThan(61_000)
  })

  test('unknown template is an error naming it', async () => {
    await expect(Sandbox.create('no-such-template')).rejects.toThrow(/no-such-template/)
    await expect(Sandbox.create('no-such-template')).rejects.toBeInstanceOf(SandboxError)
  })

  test('a bad API key is an AuthenticationError', async () => {
    await expect(Sandbox.create({ apiKey: 'e2b_0000000000000000000000000000000000000000' })).rejects.toBeInstanceOf(AuthenticationError)
    await expect(Sandbox.list({ apiKey: 'e2b_nope' }).nextItems()).rejects.toBeInstanceOf(AuthenticationError)
  })

  test('an unknown sandbox is NotFound', async () => {
    await expect(Sandbox.getInfo('nosuchsandbox000000')).rejects.toBeInstanceOf(SandboxNotFoundError)
    await expect(Sandbox.connect('nosuchsandbox000000')).rejects.toBeInstanceOf(NotFoundError)
    await expect(Sandbox.setTimeout('nosuchsandbox000000', 10_000)).rejects.toBeInstanceOf(SandboxNotFoundError)
  })
})

describe('list', () => {
  test('metadata and state filters, pagination', async () => {
    const tag = `run-${Date.now()}`
    const ids = []
    for (let i = 0; i < 3; i++) {
      const sbx = await create({ metadata: { tag, i: String(i), odd: String(i % 2 === 1) } })
      ids.push(sbx.sandboxId)
    }
    const all = []
    const pages = Sandbox.list({ query: { metadata: { tag } }, limit: 2 })
    let n = 0
    while (pages.hasNext) {
      const items = await pages.nextItems()
      expect(items.length).toBeLessThanOrEqual(2)
      all.push(...items)
      if (++n > 5) throw new Error('pagination does not end')
    }
    expect(n).toBe(2)
    // Newest first by default.
    expect(all.map((s) => s.sandboxId)).toEqual([...ids].reverse())
    expect(all[0].metadata.tag).toBe(tag)
    expect(all[0].state).toBe('running')

    const odd = await Sandbox.list({ query: { metadata: { tag, odd: 'true' } } }).nextItems()
    expect(odd.map((s) => s.sandboxId)).toEqual([ids[1]])
    const paused = await Sandbox.list({ query: { metadata: { tag }, state: ['paused'] } }).nextItems()
    expect(paused).toEqual([])
    const running = await Sandbox.list({ query: { metadata: { tag }, state: ['running'] } }).nextItems()
    expect(running.length).toBe(3)
    // Special characters in metadata survive the double encoding.
    const special = await create({ metadata: { 'k y&=': 'v%2F&x=1' } })
    const found = await Sandbox.list({ query: { metadata: { 'k y&=': 'v%2F&x=1' } } }).nextItems()
    expect(found.map((s) => s.sandboxId)).toEqual([special.sandboxId])
  })
})

describe('lifetime', () => {
  test('setTimeout longer and shorter, then expiry kills it', async () => {
    const sbx = await create({ timeoutMs: 30_000 })
    await sbx.setTimeout(600_000)
    let info = await sbx.getInfo()
    expect(info.endAt.getTime() - Date.now()).toBeGreaterThan(590_000)
    await sbx.setTimeout(2_000)
    info = await sbx.getInfo()
    expect(info.endAt.getTime() - Date.now()).toBeLessThan(2_500)
    const deadline = Date.now() + 15_000
    while (await sbx.isRunning()) {
      if (Date.now() > deadline) throw new Error('the sandbox outlived its timeout by 13 s')
      await new Promise((r) => setTimeout(r, 250))
    }
    await expect(sbx.getInfo()).rejects.toBeInstanceOf(SandboxNotFoundError)
  })

  test('kill twice: the second returns false; isRunning turns false', async () => {
    const sbx = await create()
    expect(await sbx.isRunning()).toBe(true)
    expect(await Sandbox.kill(sbx.sandboxId)).toBe(true)
    expect(await Sandbox.kill(sbx.sandboxId)).toBe(false)
    expect(await sbx.isRunning()).toBe(false)
  })

  test('connect returns the running sandbox and extends its timeout', async () => {
    const sbx = await create({ timeoutMs: 20_000 })
    await sbx.files.write('/tmp/mark', 'still here')
    const again = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 120_000 })
    expect(again.sandboxId).toBe(sbx.sandboxId)
    expect(await again.files.read('/tmp/mark')).toBe('still here')
    const info = await again.getInfo()
    expect(info.endAt.getTime() - Date.now()).toBeGreaterThan(110_000)
    // Connect only extends: a shorter timeout leaves the end where it is.
    await Sandbox.connect(sbx.sandboxId, { timeoutMs: 5_000 })
    expect((await again.getInfo()).endAt.getTime()).toBe(info.endAt.getTime())
  })
})

describe('through the proxy', () => {
  test('commands and files', async () => {
    const sbx = await create()
    await sbx.files.write('/home/user/data.txt', 'x'.repeat(100_000))
    const r = await sbx.commands.run('wc -c < /home/user/data.txt && pwd')
    expect(r.stdout).toBe('100000\n/home/user\n')
    expect(await sbx.files.exists('/home/user/data.txt')).toBe(true)
    const list = await sbx.files.list('/home/user')
    expect(list.map((e) => e.name)).toContain('data.txt')
    const fail = sbx.commands.run('exit 3')
    await expect(fail).rejects.toThrow(/exit status 3/)
  })

  test('an HTTP server on port 8000 is reachable by host and by headers', async () => {
    const sbx = await create()
    await sbx.files.write('/home/user/www/hello.txt', 'hi from the sandbox')
    const server = await sbx.commands.run('cd /home/user/www && python3 -m http.server 8000', { background: true })
    const host = sbx.getHost(8000)
    expect(host).toBe(`8000-${sbx.sandboxId}.localhost`)
    let res
    const deadline = Date.now() + 15_000
    for (;;) {
      res = await rawGet('/hello.txt', { host: `${host}:${w.proxyPort}` })
      if (res.status === 200 || Date.now() > deadline) break
      await new Promise((r) => setTimeout(r, 100))
    }
    expect(res.status).toBe(200)
    expect(res.body).toBe('hi from the sandbox')
    const byHeaders = await fetch(`${w.sandboxUrl}/hello.txt`, { headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '8000' } })
    expect(byHeaders.status).toBe(200)
    expect(await byHeaders.text()).toBe('hi from the sandbox')
    // A closed port is a 502 that names it.
    const closed = await rawGet('/', { host: `8001-${sbx.sandboxId}.localhost` })
    expect(closed.status).toBe(502)
    expect(JSON.parse(closed.body)).toMatchObject({ code: 502, port: 8001 })
    await server.kill()
  })

  test('a gone sandbox is a 502 JSON naming it', async () => {
    const res = await rawGet('/health', { host: 'localhost', 'E2b-Sandbox-Id': 'nosuchsandbox000000', 'E2b-Sandbox-Port': '49983' })
    expect(res.status).toBe(502)
    expect(JSON.parse(res.body)).toEqual({ sandboxId: 'nosuchsandbox000000', message: 'The sandbox was not found', code: 502 })
  })

  test('envd refuses a request without the sandbox access token', async () => {
    const sbx = await create()
    const headers = { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '49983', 'Content-Type': 'application/json' }
    const res = await fetch(`${w.sandboxUrl}/process.Process/List`, { method: 'POST', headers, body: '{}' })
    expect(res.status).toBe(401)
    const files = await fetch(`${w.sandboxUrl}/files?path=/etc/hosts`, { headers })
    expect(files.status).toBe(401)
    const info = await fetch(`${w.apiUrl}/sandboxes/${sbx.sandboxId}`, { headers: { 'X-API-Key': w.apiKey } }).then((r) => r.json())
    expect(info.envdAccessToken).toBeTruthy()
    const ok = await fetch(`${w.sandboxUrl}/files?path=/etc/hosts`, { headers: { ...headers, 'X-Access-Token': info.envdAccessToken } })
    expect(ok.status).toBe(200)
    expect(await ok.text()).toContain(sbx.sandboxId)
  })
})

describe('REST details', () => {
  const api = (path, init = {}) => fetch(`${w.apiUrl}${path}`, { ...init, headers: { 'X-API-Key': w.apiKey, 'Content-Type': 'application/json', ...init.headers } })

  test('POST /sandboxes defaults to 15 s; errors are {code,message}', async () => {
    const res = await api('/sandboxes', { method: 'POST', body: JSON.stringify({ templateID: 'base' }) })
    expect(res.status).toBe(201)
    const sb = await res.json()
    made.push(sb.sandboxID)
    expect(sb).toMatchObject({ templateID: 'base', envdVersion: '0.6.4', domain: null })
    expect(sb.trafficAccessToken).toBeTruthy()
    const info = await api(`/sandboxes/${sb.sandboxID}`).then((r) => r.json())
    const ttl = Date.parse(info.endAt) - Date.parse(info.startedAt)
    expect(ttl).toBe(15_000)
    expect(info.lifecycle).toEqual({ autoResume: false, onTimeout: 'kill' })

    const neg = await api('/sandboxes', { method: 'POST', body: JSON.stringify({ templateID: 'base', timeout: -1 }) })
    expect(neg.status).toBe(400)
    expect(await neg.json()).toMatchObject({ code: 400 })
    const missing = await api('/sandboxes/a%2Fb')
    expect(missing.status).toBe(404)
    expect(await missing.json()).toEqual({ code: 404, message: 'sandbox not found: a/b' })
    const noKey = await fetch(`${w.apiUrl}/v2/sandboxes`)
    expect(noKey.status).toBe(401)
    expect(await noKey.json()).toMatchObject({ code: 401 })
    const badToken = await api('/v2/sandboxes?nextToken=zzz')
    expect(badToken.status).toBe(400)
    const logs = await api(`/sandboxes/${sb.sandboxID}/logs`).then((r) => r.json())
    expect(logs.logEntries.some((e) => e.message === 'envd listening')).toBe(true)
  })

  test('metrics', async () => {
    const sbx = await create()
    const m = await sbx.getMetrics()
    expect(m.length).toBeGreaterThanOrEqual(1)
    expect(m[0].cpuCount).toBeGreaterThanOrEqual(1)
    expect(m[0].memUsed).toBeGreaterThan(0)
    expect(m[0].memTotal).toBeGreaterThanOrEqual(m[0].memUsed)
    expect(m[0].diskTotal).toBeGreaterThan(0)
    expect(m[0].timestamp).toBeInstanceOf(Date)
  })
})
