// The account surface through the official clients (issue 24): the CLI's
// `e2b auth login`, `auth configure` and `auth logout` (GET /teams), `e2b
// template publish` and `unpublish` (PATCH /v2/templates/{id}), and through
// the SDK and raw requests the API keys endpoints, the memCache metric,
// X-Total-Running and the pages of GET /v2/templates.
//
// `e2b auth login` signs in through E2B's dashboard in a browser, and
// `auth configure` refreshes the OAuth token with E2B's identity provider
// first (it reads the access token as a JWT; Warren's is not one, so the
// CLI always finds it expired). Warren has neither: the test stands in for
// the browser (an `xdg-open` on PATH that follows the sign-in page's
// redirects), the dashboard's sign-in page (it hands the CLI a Warren
// access token) and the OAuth token and revoke endpoints, all on loopback.
// What the CLI then asks of Warren is real: GET /teams with that access
// token, and the API key it answers used by every later command.
import { afterAll, beforeAll, describe, expect, inject, test } from 'vitest'
import { execFileSync, spawn } from 'node:child_process'
import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import http from 'node:http'
import { createRequire } from 'node:module'
import os from 'node:os'
import path from 'node:path'
import { Sandbox, Template } from 'e2b'
import { warrenBinary } from '../setup/start-warren.mjs'

const cliPackage = createRequire(import.meta.url).resolve('@e2b/cli/package.json')
const cliBin = path.join(path.dirname(cliPackage), 'dist', 'index.js')
const w = inject('warren')
const tmp = mkdtempSync(path.join(os.tmpdir(), 'warren-e2e-account-'))
const made = []
afterAll(async () => {
  for (const id of made) await Sandbox.kill(id).catch(() => {})
  rmSync(tmp, { recursive: true, force: true })
})

// e2b runs the CLI with Warren's URLs, env's additions (no API key unless
// env has one) and input written to its stdin once its output matches
// input.after; it returns the exit code and output.
function e2b(args, { env = {}, home, input, timeoutMs = 60_000 } = {}) {
  return new Promise((resolve, reject) => {
    const p = spawn(process.execPath, [cliBin, ...args], {
      env: {
        PATH: process.env.PATH, HOME: home, NO_COLOR: '1', FORCE_COLOR: '0',
        E2B_API_URL: w.apiUrl, E2B_SANDBOX_URL: w.sandboxUrl, E2B_DOMAIN: 'localhost', ...env,
      },
      stdio: ['pipe', 'pipe', 'pipe'],
    })
    let stdout = ''
    let stderr = ''
    let fed = false
    p.stdout.on('data', (d) => {
      stdout += d
      if (input && !fed && input.after.test(stdout)) {
        fed = true
        p.stdin.write(input.text)
      }
    })
    p.stderr.on('data', (d) => { stderr += d })
    if (!input) p.stdin.end()
    const timer = setTimeout(() => { p.kill('SIGKILL'); reject(new Error(`e2b ${args.join(' ')} ran longer than ${timeoutMs} ms\n${stdout}\n${stderr}`)) }, timeoutMs)
    p.on('close', (code) => { clearTimeout(timer); resolve({ code, stdout, stderr }) })
  })
}

async function ok(args, opts) {
  const r = await e2b(args, opts)
  expect(r.code, `e2b ${args.join(' ')}\n${r.stdout}\n${r.stderr}`).toBe(0)
  return r
}

// api calls Warren's REST API with the given headers.
async function api(method, p, { body, headers = { 'X-API-Key': w.apiKey } } = {}) {
  const res = await fetch(w.apiUrl + p, {
    method, headers: { 'Content-Type': 'application/json', ...headers },
    body: body === undefined ? undefined : JSON.stringify(body),
  })
  const text = await res.text()
  let json = null
  try { json = text ? JSON.parse(text) : null } catch {}
  return { status: res.status, headers: res.headers, body: json, text }
}

const bearer = () => ({ Authorization: `Bearer ${w.accessToken}` })

// otherTeam makes a team of its own on the suite's server, with an API key
// (`warren keys create --team`): its ID, key and key ID.
function otherTeam(team) {
  const out = execFileSync(warrenBinary, ['keys', 'create', '--data-dir', w.dataDir, '--team', team, '--name', 'account suite'],
    { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] })
  const m = out.match(/\(id ([0-9a-f-]{36})\).*\n(e2b_[0-9a-f]+)/)
  if (!m) throw new Error(`warren keys create printed no key:\n${out}`)
  return { team, keyId: m[1], key: m[2] }
}

// The stand-ins for E2B's sign-in page and OAuth endpoints, on loopback.
function identityProvider() {
  const seen = { signIns: 0, refreshes: [], revokes: [] }
  let base
  const refresh = { current: 'refresh-1', next: 2 }
  const srv = http.createServer(async (req, res) => {
    const u = new URL(req.url, base)
    let body = ''
    for await (const c of req) body += c
    if (req.method === 'GET' && u.pathname === '/docs/api/cli') {
      if (u.searchParams.get('state')) {
        res.end(`sign-in ${u.searchParams.get('state')}`)
        return
      }
      seen.signIns++
      const next = new URL(u.searchParams.get('next'))
      for (const [k, v] of Object.entries({
        email: 'user@warren.test', accessToken: w.accessToken, refreshToken: refresh.current,
        tokenEndpoint: `${base}/oauth/token`, revokeEndpoint: `${base}/oauth/revoke`, clientId: 'warren-e2e',
      })) next.searchParams.set(k, v)
      res.writeHead(302, { location: next.href }).end()
      return
    }
    const form = Object.fromEntries(new URLSearchParams(body))
    if (req.method === 'POST' && u.pathname === '/oauth/token') {
      seen.refreshes.push(form)
      if (form.grant_type !== 'refresh_token' || form.refresh_token !== refresh.current || form.client_id !== 'warren-e2e') {
        res.writeHead(400, { 'content-type': 'application/json' }).end(JSON.stringify({ error: 'invalid_grant' }))
        return
      }
      refresh.current = `refresh-${refresh.next++}`
      res.writeHead(200, { 'content-type': 'application/json' })
        .end(JSON.stringify({ access_token: w.accessToken, refresh_token: refresh.current, token_type: 'bearer' }))
      return
    }
    if (req.method === 'POST' && u.pathname === '/oauth/revoke') {
      seen.revokes.push(form)
      res.end()
      return
    }
    res.writeHead(404).end()
  })
  return new Promise((resolve) => srv.listen(0, '127.0.0.1', () => {
    base = `http://127.0.0.1:${srv.address().port}`
    resolve({ base, seen, refresh, close: () => new Promise((r) => srv.close(r)) })
  }))
}

describe('e2b auth', () => {
  let idp
  let home
  let fakeBin
  let env
  beforeAll(async () => {
    idp = await identityProvider()
    home = mkdtempSync(path.join(tmp, 'home-'))
    // The browser: follows the sign-in page to the CLI's callback and back.
    fakeBin = mkdtempSync(path.join(tmp, 'bin-'))
    const log = path.join(fakeBin, 'browser.log')
    writeFileSync(path.join(fakeBin, 'xdg-open'), [
      `#!${process.execPath}`,
      `const fs = require('node:fs')`,
      `fetch(process.argv[2], { signal: AbortSignal.timeout(20000) })`,
      `  .then(async (r) => fs.appendFileSync(${JSON.stringify(log)}, r.status + ' ' + r.url + ' ' + (await r.text()) + '\\n'))`,
      `  .catch((e) => fs.appendFileSync(${JSON.stringify(log)}, 'error ' + e + ' ' + (e.cause || '') + '\\n'))`,
      '',
    ].join('\n'))
    chmodSync(path.join(fakeBin, 'xdg-open'), 0o755)
    env = { PATH: `${fakeBin}:${process.env.PATH}`, E2B_DOCS_BASE: `${idp.base}/docs` }
  })
  afterAll(async () => { await idp?.close() })

  const config = () => JSON.parse(readFileSync(path.join(home, '.e2b', 'config.json'), 'utf8'))

  test('login: GET /teams with the access token gives a working API key', async () => {
    const keysBefore = (await api('GET', '/api-keys', { headers: bearer() })).body.length
    const r = await e2b(['auth', 'login'], { env, home })
    const browser = existsSync(path.join(fakeBin, 'browser.log')) ? readFileSync(path.join(fakeBin, 'browser.log'), 'utf8') : ''
    expect(r.code, `${r.stdout}\n${r.stderr}\nbrowser: ${browser}`).toBe(0)
    expect(idp.seen.signIns).toBe(1)
    expect(r.stdout).toContain('Logged in as user@warren.test with selected project default')
    const c = config()
    expect(c.projectId).toBe('default')
    expect(c.projectApiKey).toMatch(/^e2b_[0-9a-f]+$/)
    expect(c.projectApiKey).not.toBe(w.apiKey)
    // GET /teams made a key of the team for the CLI, listed with a mask only.
    const keys = (await api('GET', '/api-keys', { headers: bearer() })).body
    expect(keys.length).toBe(keysBefore + 1)
    expect(JSON.stringify(keys)).not.toContain(c.projectApiKey)

    // Every later command takes that key: no E2B_API_KEY in its environment.
    const sbx = await Sandbox.create({ apiKey: c.projectApiKey, metadata: { suite: 'account-login' } })
    made.push(sbx.sandboxId)
    const list = JSON.parse((await ok(['sandbox', 'list', '--metadata', 'suite=account-login', '--format', 'json'], { env, home })).stdout)
    expect(list.map((s) => s.sandboxId)).toEqual([sbx.sandboxId])
    const info = await ok(['auth', 'info'], { env, home })
    expect(info.stdout).toContain('user@warren.test')
  })

  test('configure: refreshes the token, asks GET /teams, keeps the chosen project', async () => {
    const before = config()
    const r = await ok(['auth', 'configure'], { env, home, input: { after: /Select project/, text: '\n' } })
    // Warren's access token is no JWT: the CLI refreshed it first.
    expect(idp.seen.refreshes.map((f) => f.refresh_token)).toEqual([before.tokens.refresh_token])
    expect(r.stdout).toContain('Project default (default) selected.')
    const c = config()
    expect(c.projectId).toBe('default')
    expect(c.projectApiKey).toMatch(/^e2b_[0-9a-f]+$/)
    expect(c.projectApiKey).not.toBe(before.projectApiKey)
    expect(c.tokens.refresh_token).toBe(idp.refresh.current)
    const list = await ok(['sandbox', 'list', '--format', 'json'], { env, home })
    expect(Array.isArray(JSON.parse(list.stdout))).toBe(true)
  })

  test('logout revokes the refresh token and forgets the key', async () => {
    const rt = config().tokens.refresh_token
    const r = await ok(['auth', 'logout'], { env, home })
    expect(r.stdout).toContain('Logged out.')
    expect(idp.seen.revokes.map((f) => f.token)).toEqual([rt])
    const list = await e2b(['sandbox', 'list'], { env, home })
    expect(list.code).toBe(1)
    expect(list.stderr).toContain('You must be logged in')
  })

  test('GET /teams takes an access token only', async () => {
    const r = await api('GET', '/teams')
    expect(r.status).toBe(401)
    expect(r.body.code).toBe(401)
    const none = await api('GET', '/teams', { headers: {} })
    expect(none.status).toBe(401)
  })
})

describe('e2b template publish and unpublish', () => {
  const name = `e2e-pub-${Date.now()}`
  let templateId
  let other
  beforeAll(async () => {
    other = otherTeam('e2e-account-pub')
    const built = await Template.build(Template().fromTemplate('base').runCmd('echo published > /home/user/pub.txt'), name, { cpuCount: 1, memoryMB: 512 })
    templateId = built.templateId
  }, 300_000)

  const mine = async () => (await api('GET', '/templates')).body.find((t) => t.templateID === templateId)
  const asOther = () => Sandbox.create(templateId, { apiKey: other.key, metadata: { suite: 'account-pub' } })

  test('private: another team can neither use nor publish it', async () => {
    expect((await mine()).public).toBe(false)
    // Not found, as if it were not there.
    await expect(asOther()).rejects.toThrow(/^404: template not found/)
    for (const p of [`/v2/templates/${templateId}`, `/templates/${templateId}`]) {
      const r = await api('PATCH', p, { body: { public: true }, headers: { 'X-API-Key': other.key } })
      expect(r.status, `${p}: ${r.text}`).toBe(404)
    }
    expect((await mine()).public).toBe(false)
  })

  test('publish through the CLI: public in the API, usable by another team', async () => {
    const r = await ok(['template', 'publish', templateId, '--yes'], { env: { E2B_API_KEY: w.apiKey }, home: tmp })
    expect(r.stdout).toContain('Publishing sandbox template')
    expect((await mine()).public).toBe(true)
    const v2 = (await api('GET', '/v2/templates')).body.find((t) => t.templateID === templateId)
    expect(v2.public).toBe(true)
    const sbx = await asOther()
    made.push(sbx.sandboxId)
    expect(await sbx.files.read('/home/user/pub.txt')).toBe('published\n')
    // Using it is all another team may do.
    for (const [m, p, body] of [['PATCH', `/v2/templates/${templateId}`, { public: false }], ['DELETE', `/templates/${templateId}`]]) {
      const res = await api(m, p, { body, headers: { 'X-API-Key': other.key } })
      expect([403, 404], `${m} ${p}: ${res.status} ${res.text}`).toContain(res.status)
    }
    expect((await mine()).public).toBe(true)
    await sbx.kill()
  })

  test('unpublish through the CLI: private again', async () => {
    const r = await ok(['template', 'unpublish', templateId, '--yes'], { env: { E2B_API_KEY: w.apiKey }, home: tmp })
    expect(r.stdout).toContain('Unpublishing sandbox template')
    expect((await mine()).public).toBe(false)
    await expect(asOther()).rejects.toThrow(/^404: template not found/)
  })

  test('an unknown template', async () => {
    const r = await e2b(['template', 'publish', 'nosuchtemplate00000', '--yes'], { env: { E2B_API_KEY: w.apiKey }, home: tmp })
    expect(r.code).toBe(1)
    expect(r.stderr).toContain('Error publishing sandbox template')
  })
})

describe('API keys over the API', () => {
  test('create, list (mask only), rename, delete; the deleted key fails at once', async () => {
    const c = await api('POST', '/api-keys', { body: { name: 'e2e key' }, headers: bearer() })
    expect(c.status).toBe(201)
    expect(c.body.key).toMatch(/^e2b_[0-9a-f]+$/)
    expect(c.body.name).toBe('e2e key')
    const id = c.body.id
    const key = c.body.key

    let list = await api('GET', '/api-keys', { headers: bearer() })
    expect(list.status).toBe(200)
    const listed = list.body.find((k) => k.id === id)
    expect(listed.name).toBe('e2e key')
    expect(listed.key).toBeUndefined()
    expect(list.text).not.toContain(key)
    expect(listed.mask.prefix).toBe('e2b_')
    expect(key.startsWith(listed.mask.prefix + listed.mask.maskedValuePrefix)).toBe(true)
    expect(key.endsWith(listed.mask.maskedValueSuffix)).toBe(true)
    expect(listed.mask.valueLength).toBe(key.length - 'e2b_'.length)
    // Only API keys are listed, never the access tokens.
    expect(list.body.every((k) => k.mask.prefix === 'e2b_')).toBe(true)

    expect((await api('GET', '/v2/sandboxes', { headers: { 'X-API-Key': key } })).status).toBe(200)
    const sbx = await Sandbox.create({ apiKey: key })
    made.push(sbx.sandboxId)

    expect((await api('PATCH', `/api-keys/${id}`, { body: { name: 'renamed' }, headers: bearer() })).status).toBe(200)
    list = await api('GET', '/api-keys', { headers: bearer() })
    expect(list.body.find((k) => k.id === id).name).toBe('renamed')

    expect((await api('DELETE', `/api-keys/${id}`, { headers: bearer() })).status).toBe(204)
    expect((await api('GET', '/v2/sandboxes', { headers: { 'X-API-Key': key } })).status).toBe(401)
    await expect(Sandbox.list({ apiKey: key }).nextItems()).rejects.toThrow(/Unauthorized/)
    expect((await api('DELETE', `/api-keys/${id}`, { headers: bearer() })).status).toBe(404)
    list = await api('GET', '/api-keys', { headers: bearer() })
    expect(list.body.find((k) => k.id === id)).toBeUndefined()
    // What the key made stays the team's.
    expect((await Sandbox.getInfo(sbx.sandboxId)).sandboxId).toBe(sbx.sandboxId)
    await Sandbox.kill(sbx.sandboxId)
  })

  test('an API key cannot use them', async () => {
    for (const [m, p, body] of [['GET', '/api-keys'], ['POST', '/api-keys', { name: 'x' }], ['PATCH', '/api-keys/00000000-0000-0000-0000-000000000000', { name: 'x' }], ['DELETE', '/api-keys/00000000-0000-0000-0000-000000000000']]) {
      const r = await api(m, p, { body })
      expect(r.status, `${m} ${p}`).toBe(401)
      expect(r.body.code).toBe(401)
    }
  })

  test("another team's key ID is not found, and its key keeps working", async () => {
    const other = otherTeam('e2e-account-keys')
    expect((await api('PATCH', `/api-keys/${other.keyId}`, { body: { name: 'stolen' }, headers: bearer() })).status).toBe(404)
    expect((await api('DELETE', `/api-keys/${other.keyId}`, { headers: bearer() })).status).toBe(404)
    expect((await api('GET', '/api-keys', { headers: bearer() })).text).not.toContain(other.keyId)
    expect((await api('GET', '/v2/sandboxes', { headers: { 'X-API-Key': other.key } })).status).toBe(200)
  })

  test('bad input', async () => {
    expect((await api('POST', '/api-keys', { body: { name: '' }, headers: bearer() })).status).toBe(400)
    expect((await api('POST', '/api-keys', { body: { name: 'x'.repeat(300) }, headers: bearer() })).status).toBe(400)
    expect((await api('PATCH', '/api-keys/not-a-uuid', { body: { name: 'x' }, headers: bearer() })).status).toBe(400)
  })
})

describe('live sandbox answers', () => {
  test('getMetrics() has memCache, > 0 once a file is written', async () => {
    const sbx = await Sandbox.create({ metadata: { suite: 'account-metrics' } })
    made.push(sbx.sandboxId)
    await sbx.commands.run('head -c 33554432 /dev/urandom > /home/user/cached && sync')
    let last = []
    // Metrics are sampled every 5 s: wait (bounded) for one after the write.
    for (let i = 0; i < 30; i++) {
      last = await sbx.getMetrics()
      if (last.some((m) => m.memCache > 0)) break
      await new Promise((r) => setTimeout(r, 1000))
    }
    expect(last.length).toBeGreaterThan(0)
    for (const m of last) expect(typeof m.memCache).toBe('number')
    expect(last.some((m) => m.memCache > 0), JSON.stringify(last)).toBe(true)
    await sbx.kill()
  })

  test('X-Total-Running counts the running sandboxes the filters match, across pages', async () => {
    const tag = `account-total-${Date.now()}`
    for (let i = 0; i < 3; i++) made.push((await Sandbox.create({ metadata: { suite: tag } })).sandboxId)
    const q = `metadata=${encodeURIComponent(`suite=${tag}`)}`
    const page = await api('GET', `/v2/sandboxes?state=running&limit=1&${q}`)
    expect(page.status).toBe(200)
    expect(page.body.length).toBe(1)
    expect(page.headers.get('x-total-running')).toBe('3')
    // The whole team's count matches what the SDK lists, page by page.
    const all = await api('GET', '/v2/sandboxes?state=running&limit=1')
    const paginator = Sandbox.list({ query: { state: ['running'] }, limit: 2 })
    const ids = []
    while (paginator.hasNext) ids.push(...(await paginator.nextItems()).map((s) => s.sandboxId))
    expect(Number(all.headers.get('x-total-running'))).toBe(ids.length)
    expect(ids).toEqual(expect.arrayContaining(made.slice(-3)))
    // Paused sandboxes only: no running count to give.
    const paused = await api('GET', `/v2/sandboxes?state=paused&${q}`)
    expect(paused.headers.get('x-total-running')).toBeNull()
  })

  test('GET /v2/templates: limit and nextToken walk every template once', async () => {
    for (let i = 0; i < 2; i++) {
      await Template.build(Template().fromTemplate('base').runCmd(`echo page ${i}`), `e2e-page-${i}-${Date.now()}`, { cpuCount: 1, memoryMB: 512 })
    }
    const whole = await api('GET', '/v2/templates')
    expect(whole.status).toBe(200)
    expect(whole.headers.get('x-next-token')).toBeNull()
    expect(whole.body.length).toBeGreaterThanOrEqual(3)
    const seen = []
    let token = ''
    for (let i = 0; i <= whole.body.length; i++) {
      const r = await api('GET', `/v2/templates?limit=1${token ? `&nextToken=${encodeURIComponent(token)}` : ''}`)
      expect(r.status).toBe(200)
      expect(r.body.length).toBe(1)
      seen.push(r.body[0].templateID)
      token = r.headers.get('x-next-token')
      if (!token) break
    }
    expect(seen).toEqual(whole.body.map((t) => t.templateID))
    expect((await api('GET', '/v2/templates?limit=0')).status).toBe(400)
    expect((await api('GET', '/v2/templates?nextToken=garbage')).status).toBe(400)
  }, 300_000)
})
