// The web dashboard (issue 26) in a real browser: Debian's headless
// Chromium driven by puppeteer-core against the suite's `warren serve`.
// One browser, one sandbox per team, several checks on each. Screenshots
// of each page are saved under the test's temp dir, named by page, and
// their paths printed.
import { afterAll, beforeAll, describe, expect, inject, test } from 'vitest'
import { execFileSync } from 'node:child_process'
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs'
import http from 'node:http'
import os from 'node:os'
import path from 'node:path'
import puppeteer from 'puppeteer-core'
import { Sandbox, Template } from 'e2b'
import { warrenBinary } from '../setup/start-warren.mjs'

const w = inject('warren')
const chromium = process.env.CHROMIUM || '/usr/bin/chromium'
const shots = mkdtempSync(path.join(os.tmpdir(), 'warren-e2e-dashboard-'))
const run = `dash${Date.now()}`
let browser, page, sbx, other, otherKey, build
// A webhook receiver on loopback (the suite's server allows 127.0.0.0/8).
let receiver, receiverUrl
const received = []

function teamKey(team) {
  const out = execFileSync(warrenBinary, ['keys', 'create', '--data-dir', w.dataDir, '--team', team, '--name', 'dashboard suite'],
    { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] })
  const m = out.match(/\n(e2b_[0-9a-f]{40})/)
  if (!m) throw new Error(`warren keys create printed no key:\n${out}`)
  return m[1]
}

async function shot(name, p = page) {
  const file = path.join(shots, `${name}.png`)
  await p.screenshot({ path: file, fullPage: true })
  console.log(`dashboard screenshot (${name}): ${file}`)
}

// go opens a page of the dashboard and waits for its heading.
async function go(hash, heading) {
  await page.goto(`${w.apiUrl}/dashboard/${hash}`)
  await page.waitForFunction((t) => document.querySelector('main h1')?.textContent.includes(t), { timeout: 15_000 }, heading)
}

async function signIn(p, key) {
  await p.goto(`${w.apiUrl}/`) // a browser's GET / goes to the dashboard
  await p.waitForSelector('#key')
  await p.type('#key', key)
  await p.click('form.card button[type=submit]')
}

const errorText = (p) => p.$eval('#error', (e) => (e.hidden ? '' : e.textContent))

beforeAll(async () => {
  if (!existsSync(chromium)) throw new Error(`${chromium} is missing: run scripts/install-deps.sh (it installs Debian's chromium)`)
  otherKey = teamKey(`${run}-b`)
  receiver = http.createServer((req, res) => {
    const chunks = []
    req.on('data', (c) => chunks.push(c))
    req.on('end', () => {
      received.push({ headers: req.headers, event: JSON.parse(Buffer.concat(chunks).toString('utf8')) })
      res.writeHead(200).end()
    })
  })
  await new Promise((r) => receiver.listen(0, '127.0.0.1', r))
  receiverUrl = `http://127.0.0.1:${receiver.address().port}/hook`
  const tpl = Template().fromTemplate('base').runCmd(`echo ${run}-build-line`)
  ;[browser, sbx, other, build] = await Promise.all([
    puppeteer.launch({ executablePath: chromium, headless: true, args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'] }),
    Sandbox.create('base', { metadata: { suite: 'dashboard', run } }),
    Sandbox.create('base', { apiKey: otherKey, metadata: { suite: 'dashboard', run, team: 'b' } }),
    Template.buildInBackground(tpl, `${run}-tpl`, { cpuCount: 1, memoryMB: 512 }),
  ])
  page = await browser.newPage()
  await page.setViewport({ width: 1280, height: 800 })
  page.on('dialog', (d) => d.accept())
  page.on('pageerror', (e) => console.error('dashboard page error:', e.message))
}, 90_000)

afterAll(async () => {
  await browser?.close()
  receiver?.closeAllConnections()
  receiver?.close()
  await sbx?.kill().catch(() => {})
  await other?.kill().catch(() => {})
  console.log(`dashboard screenshots: ${shots}`)
})

describe('dashboard', () => {
  test('a wrong key is refused with the API message, and no session is made', async () => {
    await signIn(page, 'e2b_' + '0'.repeat(40))
    await page.waitForFunction(() => document.querySelector('#signin-error')?.textContent)
    expect(await page.$eval('#signin-error', (e) => e.textContent)).toMatch(/invalid API key/)
    expect((await page.cookies()).filter((c) => c.name === 'warren_session')).toEqual([])
    await shot('signin')
  })

  test('sign in: an httpOnly SameSite=Strict cookie; the plain API still wants X-API-Key', async () => {
    await page.$eval('#key', (e) => { e.value = '' })
    await signIn(page, w.apiKey)
    await page.waitForSelector('#sandboxes')
    const [c] = (await page.cookies()).filter((c) => c.name === 'warren_session')
    expect(c.httpOnly).toBe(true)
    expect(c.sameSite).toBe('Strict')
    const cookie = `warren_session=${c.value}`
    // The cookie alone opens nothing outside /dashboard/api/.
    expect((await fetch(`${w.apiUrl}/v2/sandboxes`, { headers: { cookie } })).status).toBe(401)
    // Without the dashboard's header, or from another origin: refused.
    expect((await fetch(`${w.apiUrl}/dashboard/api/v2/sandboxes`, { headers: { cookie } })).status).toBe(403)
    const foreign = await fetch(`${w.apiUrl}/dashboard/api/sandboxes/${sbx.sandboxId}`,
      { method: 'DELETE', headers: { cookie, 'X-Warren-Dashboard': '1', Origin: 'http://evil.example' } })
    expect(foreign.status).toBe(403)
    expect((await fetch(`${w.apiUrl}/dashboard/api/v2/sandboxes`, { headers: { cookie, 'X-Warren-Dashboard': '1' } })).status).toBe(200)
    // A preflight from another origin is granted nothing.
    const pre = await fetch(`${w.apiUrl}/dashboard/api/v2/sandboxes`, {
      method: 'OPTIONS', headers: { Origin: 'http://evil.example', 'Access-Control-Request-Method': 'DELETE', 'Access-Control-Request-Headers': 'x-warren-dashboard' },
    })
    expect(pre.headers.get('access-control-allow-origin')).toBeNull()
  })

  test('the list shows the SDK\'s sandbox with its metadata, not the other team\'s', async () => {
    await go('#/sandboxes', 'Sandboxes')
    const row = `tr[data-id="${sbx.sandboxId}"]`
    await page.waitForSelector(row)
    expect(await page.$eval(row, (r) => r.textContent)).toContain(`run=${run}`)
    expect(await page.$(`tr[data-id="${other.sandboxId}"]`)).toBeNull()
    // The metadata filter narrows the list to this run's sandbox.
    await page.type('#f-meta', `run=${run}`)
    await page.keyboard.press('Enter')
    await page.waitForFunction((id) => document.querySelectorAll('#sandboxes tbody tr').length === 1 && document.querySelector(`tr[data-id="${id}"]`), {}, sbx.sandboxId)
    await shot('sandboxes')
    await page.setViewport({ width: 390, height: 844 })
    await shot('sandboxes-phone')
    await page.setViewport({ width: 1280, height: 800 })
  })

  test('the sandbox page: charts draw points, the terminal runs echo, files both ways', async () => {
    await sbx.files.write('/home/user/from-sdk.txt', `written by the SDK ${run}`)
    await go(`#/sandboxes/${sbx.sandboxId}`, `Sandbox ${sbx.sandboxId}`)
    // Charts: the metrics' samples (one every 5 s) drawn by uPlot.
    await page.waitForFunction(() => ['chart-cpu', 'chart-mem', 'chart-disk'].every((id) => Number(document.getElementById(id).dataset.points) > 0 && document.querySelector(`#${id} canvas`)), { timeout: 20_000 })
    // E2B's dashboard call for the list: the latest sample of each.
    const latest = await page.evaluate(async (id) => (await (await fetch(`/dashboard/api/sandboxes/metrics?sandbox_ids=${id},nosuchsandbox`, { headers: { 'X-Warren-Dashboard': '1' } })).json()), sbx.sandboxId)
    expect(Object.keys(latest.sandboxes)).toEqual([sbx.sandboxId])
    expect(latest.sandboxes[sbx.sandboxId].memTotal).toBeGreaterThan(0)
    // The file browser lists the SDK's file and reads it.
    const entry = '#files-list li[data-path="/home/user/from-sdk.txt"]'
    await page.waitForSelector(entry, { timeout: 15_000 })
    await page.click(`${entry} button.link`)
    await page.waitForFunction((t) => document.getElementById('file-preview').textContent.includes(t), {}, `written by the SDK ${run}`)
    // An upload the SDK then reads.
    const upload = await page.$('#files-upload')
    const local = path.join(shots, 'upload.txt')
    writeFileSync(local, `uploaded from the dashboard ${run}`)
    await upload.uploadFile(local)
    await page.waitForSelector('#files-list li[data-path="/home/user/upload.txt"]', { timeout: 15_000 })
    expect(await sbx.files.read('/home/user/upload.txt')).toBe(`uploaded from the dashboard ${run}`)
    // The terminal: a shell over envd's PTY.
    await page.click('#terminal-start')
    await page.waitForFunction(() => document.getElementById('terminal-status').textContent.startsWith('Connected'), { timeout: 15_000 })
    await page.click('#terminal')
    await page.keyboard.type(`echo term-$((6*7))-${run}\n`)
    await page.waitForFunction((t) => document.querySelector('#terminal .xterm-rows')?.textContent.includes(t), { timeout: 15_000 }, `term-42-${run}`)
    await shot('sandbox')
  })

  test('fork from the sandbox page', async () => {
    const t0 = Date.now()
    await page.click('#snap-title ~ .filters button:nth-child(2)')
    await page.waitForSelector('#fork-result a', { timeout: 30_000 })
    const child = (await page.$eval('#fork-result a', (a) => a.textContent)).replace('Fork ', '')
    try {
      expect((await Sandbox.getInfo(child)).state).toBe('running')
    } finally {
      await Sandbox.kill(child)
    }
    console.log(`fork from the dashboard: ${Date.now() - t0} ms`)
  })

  test('pause and resume from the list', async () => {
    await go('#/sandboxes', 'Sandboxes')
    const row = `tr[data-id="${sbx.sandboxId}"]`
    await page.waitForSelector(`${row} button.pause`)
    await page.click(`${row} button.pause`)
    await page.waitForSelector(`${row}[data-state="paused"] button.resume`, { timeout: 30_000 })
    expect((await Sandbox.getInfo(sbx.sandboxId)).state).toBe('paused')
    await page.click(`${row} button.resume`)
    await page.waitForSelector(`${row}[data-state="running"]`, { timeout: 30_000 })
    expect((await Sandbox.getInfo(sbx.sandboxId)).state).toBe('running')
  })

  test('webhooks: created in the browser (secret never shown back), an event reaches the receiver, its delivery listed; disable, delete', async () => {
    const secret = `whsec-${run}`
    await go('#/webhooks', 'Webhooks')
    await page.type('#wh-name', `${run}-hook`)
    await page.type('#wh-secret', secret)
    // A cloud metadata address is refused: the API's message is shown.
    await page.type('#wh-url', 'http://169.254.169.254/latest')
    await page.click('#wh-form button[type=submit]')
    await page.waitForFunction(() => !document.getElementById('error').hidden)
    expect(await errorText(page)).toMatch(/169\.254\.169\.254|address|not allowed|refused/i)
    await page.$eval('#wh-url', (e) => { e.value = '' })
    await page.type('#wh-url', receiverUrl)
    await page.click('#wh-form button[type=submit]')
    const row = await page.waitForFunction((n) => [...document.querySelectorAll('#webhooks tbody tr')].find((r) => r.textContent.includes(n)), {}, `${run}-hook`)
    const id = await row.evaluate((r) => r.dataset.id)
    expect(await page.content()).not.toContain(secret)
    // A lifecycle event of the team's sandbox (a new timeout: updated).
    await sbx.setTimeout(600_000)
    const deadline = Date.now() + 10_000
    while (!received.some((r) => r.event.sandboxId === sbx.sandboxId) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100))
    const got = received.find((r) => r.event.sandboxId === sbx.sandboxId)
    expect(got?.event.type).toMatch(/^sandbox\.lifecycle\./)
    await go(`#/webhooks/${id}`, `Webhook ${run}-hook`)
    await page.waitForSelector(`#deliveries tr[data-event="${got.event.id}"][data-status="200"]`, { timeout: 10_000 })
    await shot('webhook')
    expect(await page.content()).not.toContain(secret)
    // Disable, then delete, from the list.
    await go('#/webhooks', 'Webhooks')
    await page.click(`#webhooks tr[data-id="${id}"] button.toggle`)
    await page.waitForSelector(`#webhooks tr[data-id="${id}"][data-enabled="false"]`)
    const listed = await (await fetch(`${w.apiUrl}/events/webhooks/${id}`, { headers: { 'X-API-Key': w.apiKey } })).json()
    expect(listed.enabled).toBe(false)
    await shot('webhooks')
    await page.setViewport({ width: 390, height: 844 })
    await shot('webhooks-phone')
    await page.setViewport({ width: 1280, height: 800 })
    await page.click(`#webhooks tr[data-id="${id}"] button.delete`)
    await page.waitForFunction((i) => !document.querySelector(`#webhooks tr[data-id="${i}"]`), {}, id)
    expect((await fetch(`${w.apiUrl}/events/webhooks/${id}`, { headers: { 'X-API-Key': w.apiKey } })).status).toBe(404)
  })

  test('team usage: the concurrent and start-rate charts draw the team\'s events', async () => {
    await go('#/usage', 'Team usage')
    await page.waitForFunction(() => ['chart-concurrent', 'chart-starts'].every((id) => Number(document.getElementById(id).dataset.points) > 0 && document.querySelector(`#${id} canvas`)), { timeout: 10_000 })
    // This file's creates are in the series: the running count now ends the concurrent one.
    const running = (await (await fetch(`${w.apiUrl}/v2/sandboxes?state=running&limit=100`, { headers: { 'X-API-Key': w.apiKey } })).json()).length
    expect(await page.$eval('#usage-summary', (e) => e.textContent)).toContain(`${running} running now`)
    // The series' arithmetic, on events it is given (newest first).
    // (A string: vitest would rewrite an import() in a function.)
    const s = await page.evaluate(`(async () => {
      const { series } = await import('/dashboard/usage.js')
      const ev = (type, t) => ({ type, timestamp: new Date(t * 1000).toISOString() })
      const out = series([ev('sandbox.lifecycle.killed', 1300), ev('sandbox.lifecycle.created', 1200), ev('sandbox.lifecycle.created', 1100)], 1, 1400)
      return { ys: out.running[1], rate: out.rate }
    })()`)
    expect(s.ys).toEqual([0, 1, 1, 2, 2, 1, 1])
    expect(s.rate).toEqual([[1020, 1080, 1140, 1200, 1260], [0, 1, 0, 1, 0]])
    await shot('usage')
  })

  test('volumes: browse a volume\'s files, upload and delete one; another team\'s session is refused', async () => {
    const key = { 'X-API-Key': w.apiKey, 'Content-Type': 'application/json' }
    const vol = await (await fetch(`${w.apiUrl}/volumes`, { method: 'POST', headers: key, body: JSON.stringify({ name: `${run}-vol` }) })).json()
    try {
      const put = await fetch(`${w.apiUrl}/volumecontent/${vol.volumeID}/file?path=/docs/hello.txt&force=true`,
        { method: 'PUT', headers: { Authorization: `Bearer ${vol.token}` }, body: `in the volume ${run}` })
      expect(put.status).toBe(201)
      await go('#/volumes', 'Volumes')
      await page.click(`#volumes tr[data-id="${vol.volumeID}"] a`)
      await page.waitForSelector('#vol-list li[data-path="/docs"] button')
      await page.click('#vol-list li[data-path="/docs"] button')
      await page.waitForSelector('#vol-list li[data-path="/docs/hello.txt"] button.link')
      await page.click('#vol-list li[data-path="/docs/hello.txt"] button.link')
      await page.waitForFunction((t) => document.getElementById('vol-preview').textContent.includes(t), {}, `in the volume ${run}`)
      // Upload into the directory shown; the API reads it. Then delete it.
      const local = path.join(shots, 'vol-upload.txt')
      writeFileSync(local, `uploaded to the volume ${run}`)
      await (await page.$('#vol-upload')).uploadFile(local)
      await page.waitForSelector('#vol-list li[data-path="/docs/vol-upload.txt"]', { timeout: 15_000 })
      const bearer = { Authorization: `Bearer ${vol.token}` }
      expect(await (await fetch(`${w.apiUrl}/volumecontent/${vol.volumeID}/file?path=/docs/vol-upload.txt`, { headers: bearer })).text()).toBe(`uploaded to the volume ${run}`)
      await shot('volume')
      await page.click('#vol-list li[data-path="/docs/vol-upload.txt"] button[aria-label="Delete vol-upload.txt"]')
      await page.waitForFunction(() => !document.querySelector('#vol-list li[data-path="/docs/vol-upload.txt"]'), { timeout: 15_000 })
      expect((await fetch(`${w.apiUrl}/volumecontent/${vol.volumeID}/path?path=/docs/vol-upload.txt`, { headers: bearer })).status).toBe(404)
      expect(await page.content()).not.toContain(vol.token)
      const ctx = await browser.createBrowserContext()
      const p = await ctx.newPage()
      await signIn(p, otherKey)
      await p.waitForSelector('#sandboxes')
      const status = await p.evaluate(async (id) => (await fetch(`/dashboard/api/volumecontent/${id}/dir?path=/`, { headers: { 'X-Warren-Dashboard': '1' } })).status, vol.volumeID)
      expect(status).toBe(404)
      await ctx.close()
    } finally {
      await fetch(`${w.apiUrl}/volumes/${vol.volumeID}`, { method: 'DELETE', headers: key })
    }
  })

  test('a build\'s logs show on its template page', async () => {
    await go('#/templates', 'Templates')
    await page.waitForSelector(`tr[data-id="${build.templateId}"]`)
    await shot('templates')
    await go(`#/templates/${build.templateId}`, `Template ${build.templateId}`)
    await page.waitForFunction((t) => document.getElementById('build-logs').textContent.includes(t), { timeout: 45_000 }, `${run}-build-line`)
    await shot('template')
    // Structured build logs (E2B's dashboard call), newest first.
    const logs = await page.evaluate(async (t, b) => (await (await fetch(`/dashboard/api/templates/${t}/builds/${b}/logs?direction=backward&limit=100`, { headers: { 'X-Warren-Dashboard': '1' } })).json()), build.templateId, build.buildId)
    expect(logs.logs.some((e) => e.message.includes(`${run}-build-line`))).toBe(true)
    await go('#/secrets', 'Secrets')
    await shot('secrets')
    await go('#/volumes', 'Volumes')
    await shot('volumes')
  })

  test('API keys: refused for an API key with the API message; listed and created with an access token', async () => {
    await go('#/keys', 'API keys')
    // Signed in with an API key: E2B's API wants an access token here.
    await page.waitForFunction(() => !document.getElementById('error').hidden)
    expect(await errorText(page)).toMatch(/access token/)
    const ctx = await browser.createBrowserContext()
    const p = await ctx.newPage()
    await signIn(p, w.accessToken)
    await p.waitForSelector('#sandboxes')
    await p.goto(`${w.apiUrl}/dashboard/#/keys`)
    await p.waitForSelector('#keys tbody tr')
    await p.type('#key-name', `${run}-key`)
    await p.keyboard.press('Enter')
    await p.waitForSelector('#new-key')
    const key = await p.$eval('#new-key', (e) => e.textContent)
    expect((await fetch(`${w.apiUrl}/v2/sandboxes`, { headers: { 'X-API-Key': key } })).status).toBe(200)
    await shot('keys', p)
    // Revoke it from its row: the API refuses it from then on.
    const row = await p.waitForFunction((n) => [...document.querySelectorAll('#keys tbody tr')].find((r) => r.textContent.includes(n)), {}, `${run}-key`)
    const id = await row.evaluate((r) => r.dataset.id)
    p.on('dialog', (d) => d.accept())
    await p.click(`#keys tr[data-id="${id}"] button.danger`)
    await p.waitForFunction((i) => !document.querySelector(`#keys tr[data-id="${i}"]`), {}, id)
    // Refused: 401, or 429 past the address's failed-auth budget (never for a valid key).
    expect([401, 429]).toContain((await fetch(`${w.apiUrl}/v2/sandboxes`, { headers: { 'X-API-Key': key } })).status)
    await ctx.close()
  })

  test('a template\'s tags are shown once its build is done', async () => {
    const deadline = Date.now() + 45_000
    let status
    do {
      status = (await (await fetch(`${w.apiUrl}/templates/${build.templateId}/builds/${build.buildId}/status`, { headers: { 'X-API-Key': w.apiKey } })).json()).status
      if (status === 'ready' || status === 'error') break
      await new Promise((r) => setTimeout(r, 250))
    } while (Date.now() < deadline)
    expect(status).toBe('ready')
    await go(`#/templates/${build.templateId}`, `Template ${build.templateId}`)
    expect(await page.$eval('#tags tr[data-tag="default"]', (r) => r.textContent)).toContain(build.buildId)
  })

  test('nodes: only on the admin listener, only for the admin token; cordon and uncordon from the page', async () => {
    const adminToken = readFileSync(path.join(w.dataDir, 'admin-token'), 'utf8').trim()
    const h = { 'X-Warren-Dashboard': '1', 'Content-Type': 'application/json' }
    // The API's address has no admin surface: the admin token is no credential there.
    // 429 is a refusal too: the shared server has seen other files' wrong keys from
    // this address, and past that budget only failures are slowed (a valid credential
    // is always served).
    const pub = await fetch(`${w.apiUrl}/dashboard/session`, { method: 'POST', headers: h, body: JSON.stringify({ key: adminToken }) })
    expect([401, 429]).toContain(pub.status)
    expect(await page.evaluate(async () => (await fetch('/dashboard/admin/nodes', { headers: { 'X-Warren-Dashboard': '1' } })).status)).toBe(404)
    const ctx = await browser.createBrowserContext()
    const p = await ctx.newPage()
    p.on('dialog', (d) => d.accept())
    try {
      // A team's key signs in on the admin listener, and is refused the nodes.
      await p.goto(`${w.adminUrl}/dashboard/`)
      await p.waitForSelector('#key')
      await p.type('#key', w.apiKey)
      await p.click('form.card button[type=submit]')
      await p.waitForSelector('#sandboxes')
      const refused = await p.evaluate(async () => { const r = await fetch('/dashboard/admin/nodes', { headers: { 'X-Warren-Dashboard': '1' } }); return [r.status, (await r.json()).message] })
      expect(refused[0]).toBe(403)
      expect(refused[1]).toMatch(/admin/)
      await p.click('#signout')
      await p.waitForSelector('#key')
      // The admin sees the node, and cordons and uncordons it.
      await p.type('#key', adminToken)
      await p.click('form.card button[type=submit]')
      await p.waitForSelector('#nodes tr[data-name="local"][data-state="ready"]', { timeout: 10_000 })
      expect(await p.$eval('#nodes tr[data-name="local"]', (r) => r.textContent)).toMatch(/\d+ \/ \d+ MiB/)
      await shot('nodes', p)
      await p.click('#nodes tr[data-name="local"] button.cordon')
      await p.waitForSelector('#nodes tr[data-name="local"][data-state="cordoned"]')
      expect(execFileSync(warrenBinary, ['nodes', '--data-dir', w.dataDir], { encoding: 'utf8' })).toMatch(/\nlocal\s+cordoned/)
      await p.click('#nodes tr[data-name="local"] button.uncordon')
      await p.waitForSelector('#nodes tr[data-name="local"][data-state="ready"]')
      // The admin session reaches no team's API.
      expect(await p.evaluate(async () => (await fetch('/dashboard/api/v2/sandboxes', { headers: { 'X-Warren-Dashboard': '1' } })).status)).toBe(403)
    } finally {
      // Never leave the suite's node cordoned.
      execFileSync(warrenBinary, ['nodes', 'uncordon', 'local', '--data-dir', w.dataDir])
      await ctx.close()
    }
  })

  test('team B\'s session never sees team A\'s sandbox, nor reaches its envd', async () => {
    const ctx = await browser.createBrowserContext()
    const p = await ctx.newPage()
    await signIn(p, otherKey)
    await p.waitForSelector(`tr[data-id="${other.sandboxId}"]`)
    expect(await p.$(`tr[data-id="${sbx.sandboxId}"]`)).toBeNull()
    const status = await p.evaluate(async (id) => {
      const h = { 'X-Warren-Dashboard': '1' }
      const a = await fetch(`/dashboard/api/sandboxes/${id}`, { headers: h })
      const b = await fetch(`/dashboard/envd/${id}/files?path=/home/user/from-sdk.txt`, { headers: h })
      return [a.status, b.status, (await b.json()).message]
    }, sbx.sandboxId)
    expect(status.slice(0, 2)).toEqual([404, 404])
    await ctx.close()
  })

  test('CORS: envd\'s preflights through the proxy as E2B\'s envd answers them; the proxy\'s errors readable; never credentials', async () => {
    const viaProxy = (host, method, headers) => new Promise((resolve, reject) => {
      const req = http.request(`${w.sandboxUrl}/process.Process/Start`, { method, headers: { host, ...headers } }, (res) => {
        res.resume()
        res.on('end', () => resolve(res))
      })
      req.on('error', reject)
      req.end()
    })
    const origin = 'https://page.example'
    const pre = await viaProxy(`49983-${other.sandboxId}.localhost`, 'OPTIONS',
      { origin, 'access-control-request-method': 'POST', 'access-control-request-headers': 'content-type,x-access-token,connect-protocol-version' })
    expect(pre.statusCode).toBe(204)
    expect(pre.headers['access-control-allow-origin']).toBe('*')
    expect(pre.headers['access-control-allow-headers']).toContain('x-access-token')
    expect(pre.headers['access-control-allow-credentials']).toBeUndefined()
    // The call itself still needs envd's token.
    const bare = await viaProxy(`49983-${other.sandboxId}.localhost`, 'POST', { origin, 'content-type': 'application/json' })
    expect(bare.statusCode).toBe(401)
    expect(bare.headers['access-control-allow-origin']).toBe('*')
    const gone = await viaProxy('49983-nosuchsandbox0000.localhost', 'POST', { origin })
    expect(gone.statusCode).toBe(502)
    expect(gone.headers['access-control-allow-origin']).toBe('*')
  })

  test('kill from the list; the SDK sees it gone', async () => {
    await go('#/sandboxes', 'Sandboxes')
    const row = `tr[data-id="${sbx.sandboxId}"]`
    await page.waitForSelector(`${row} button.kill`)
    await page.click(`${row} button.kill`)
    await page.waitForFunction((id) => !document.querySelector(`tr[data-id="${id}"]`), { timeout: 15_000 }, sbx.sandboxId)
    expect(await sbx.isRunning()).toBe(false)
    await expect(Sandbox.getInfo(sbx.sandboxId)).rejects.toThrow()
  })
})
