// The web dashboard in a cluster (issue 26), in a real browser: two
// `--role api` processes and two `--role node` processes on PostgreSQL
// (setup/start-cluster.mjs), Debian's headless Chromium driven by
// puppeteer-core. A session signed in through one api is served by the
// other (sessions are in the store); a sandbox made by the SDK is listed
// with the node it runs on; the terminal runs through the cluster's
// proxy; a volume written through one api's dashboard door is read
// through the other, and refused to another team; E2B's dashboard-api
// answers alike through both; kill from the list; team B's session sees
// none of team A's; the nodes page on an api's admin listener lists both
// nodes, and cordon and drain from it reach the store and the node. One
// cluster, one sandbox per team. Chromium runs in a network namespace of
// its own, so that the nodes' veths coming and going do not abort its
// requests (setup/isolated-browser.mjs). Screenshots of each page under
// the test's temp dir, named by page.
import { afterAll, beforeAll, describe, expect, test } from 'vitest'
import { execFileSync } from 'node:child_process'
import { existsSync, mkdtempSync, readFileSync } from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { Sandbox } from 'e2b'
import { launchIsolatedBrowser } from '../setup/isolated-browser.mjs'
import { startCluster } from '../setup/start-cluster.mjs'
import { freePort, warrenBinary } from '../setup/start-warren.mjs'

const chromium = process.env.CHROMIUM || '/usr/bin/chromium'
const shots = mkdtempSync(path.join(os.tmpdir(), 'warren-e2e-dashboard-cluster-'))
const run = `dcl${Date.now()}`
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))
let c, isolated, browser, page, sbx, other, otherKey, adminUrl

async function shot(name, p = page) {
  const file = path.join(shots, `${name}.png`)
  await p.screenshot({ path: file, fullPage: true })
  console.log(`dashboard screenshot (${name}): ${file}`)
}

// watch logs what a page failed to load or run, for a failed test.
function watch(p) {
  p.on('requestfailed', (r) => console.error('request failed:', r.url(), r.failure()?.errorText))
  p.on('pageerror', (e) => console.error('dashboard page error:', e.message))
}

// open loads url in p and waits for ready (a selector).
async function open(p, url, ready) {
  await p.goto(url)
  await p.waitForSelector(ready, { timeout: 15_000 })
}

// signIn signs p in at base's dashboard with key, and waits for ready.
async function signIn(p, base, key, ready) {
  await open(p, `${base}/dashboard/`, '#key')
  await p.type('#key', key)
  await p.click('form.card button[type=submit]')
  await p.waitForSelector(ready, { timeout: 15_000 })
}

// apiURL is api process i's address.
const apiURL = (i) => c.apis[i].opts.apiUrl

// The node column of a sandbox's row in the list.
const nodeCell = (p, id) => p.$eval(`tr[data-id="${id}"] td:nth-child(6)`, (td) => td.textContent)

beforeAll(async () => {
  if (!existsSync(chromium)) throw new Error(`${chromium} is missing: run scripts/install-deps.sh (it installs Debian's chromium)`)
  const adminPort = await freePort()
  adminUrl = `http://127.0.0.1:${adminPort}`
  c = await startCluster({
    nodes: { dna: { prefix: 'wdca', net16: 171 }, dnb: { prefix: 'wdcb', net16: 172 } }, apis: 2, poolSize: 0,
    apiArgs: [['--admin-addr', `127.0.0.1:${adminPort}`]],
  })
  // In a network namespace of its own, where only the apis' and the
  // admin listener's ports reach the host (setup/isolated-browser.mjs).
  isolated = await launchIsolatedBrowser({ chromium, ports: [c.apis[0].port, c.apis[1].port, adminPort] })
  browser = isolated.browser
  const out = execFileSync(warrenBinary, ['keys', 'create', '--store', c.storeURL, '--team', `${run}-b`, '--name', 'dashboard cluster'],
    { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] })
  otherKey = out.match(/\n(e2b_[0-9a-f]{40})/)?.[1]
  if (!otherKey) throw new Error(`warren keys create printed no key:\n${out}`)
  ;[sbx, other] = await Promise.all([
    Sandbox.create('base', { ...c.apis[0].opts, metadata: { suite: 'dashboard-cluster', run } }),
    Sandbox.create('base', { ...c.apis[1].opts, apiKey: otherKey, metadata: { suite: 'dashboard-cluster', run, team: 'b' } }),
  ])
  page = await browser.newPage()
  watch(page)
  await page.setViewport({ width: 1280, height: 800 })
  page.on('dialog', (d) => d.accept())
}, 120_000)

afterAll(async () => {
  await isolated?.close()
  // The cluster's stop kills team A's sandboxes; team B's is this file's.
  await other?.kill().catch(() => {})
  await c?.stop()
  console.log(`dashboard screenshots: ${shots}`)
}, 120_000)

describe('dashboard in a cluster', () => {
  test('signed in through api A, the session is served by api B (sessions in the store), which lists the sandbox with its node', async () => {
    await signIn(page, apiURL(0), c.apiKey, '#sandboxes')
    const [cookie] = (await page.cookies()).filter((k) => k.name === 'warren_session')
    expect(cookie?.httpOnly).toBe(true)
    // The store keeps the cookie's hash, never the cookie nor the key.
    const rows = c.sql('SELECT id_hash, credential, mask FROM dashboard_sessions')
    expect(rows).not.toContain(cookie.value)
    expect(rows).not.toContain(c.apiKey)
    expect(rows).not.toContain(c.apiKey.slice(4, 24))
    // Cookies ignore ports: the browser sends it to api B, which has never seen it.
    await open(page, `${apiURL(1)}/dashboard/#/sandboxes`, `tr[data-id="${sbx.sandboxId}"]`)
    expect(await page.$('#key')).toBeNull()
    expect(await nodeCell(page, sbx.sandboxId)).toBe(c.nodeOf(sbx.sandboxId))
    expect(await page.$(`tr[data-id="${other.sandboxId}"]`)).toBeNull()
    await shot('sandboxes')
  })

  test('the sandbox page through api B: the terminal runs echo through the cluster proxy', async () => {
    await open(page, `${apiURL(1)}/dashboard/#/sandboxes/${sbx.sandboxId}`, '#terminal-start')
    await page.click('#terminal-start')
    await page.waitForFunction(() => document.getElementById('terminal-status').textContent.startsWith('Connected'), { timeout: 15_000 })
    await page.click('#terminal')
    await page.keyboard.type(`echo term-$((6*7))-${run} $(hostname)\n`)
    await page.waitForFunction((t) => document.querySelector('#terminal .xterm-rows')?.textContent.includes(t), { timeout: 15_000 },
      `term-42-${run} ${sbx.sandboxId}`)
    await shot('sandbox')
  })

  test('team B\'s session sees none of team A\'s sandboxes, nor reaches their envd, through either api', async () => {
    const ctx = await browser.createBrowserContext()
    try {
      const p = await ctx.newPage()
      watch(p)
      await signIn(p, apiURL(1), otherKey, '#sandboxes')
      await open(p, `${apiURL(1)}/dashboard/#/sandboxes`, `tr[data-id="${other.sandboxId}"]`)
      expect(await p.$(`tr[data-id="${sbx.sandboxId}"]`)).toBeNull()
      expect(await nodeCell(p, other.sandboxId)).toBe(c.nodeOf(other.sandboxId))
      await shot('sandboxes-team-b', p)
      for (const i of [0, 1]) {
        if (i === 0) await open(p, `${apiURL(0)}/dashboard/#/sandboxes`, `tr[data-id="${other.sandboxId}"]`)
        const status = await p.evaluate(async (id) => {
          const h = { 'X-Warren-Dashboard': '1' }
          const a = await fetch(`/dashboard/api/sandboxes/${id}`, { headers: h })
          const b = await fetch(`/dashboard/envd/${id}/files?path=/etc/hostname`, { headers: h })
          return [a.status, b.status]
        }, sbx.sandboxId)
        expect(status, `through api ${i}`).toEqual([404, 404])
      }
    } finally {
      await ctx.close()
    }
  })

  test('a volume through the dashboard\'s door of api B: written, read through api A, refused to team B; E2B\'s dashboard-api through both apis', async () => {
    const key = { 'X-API-Key': c.apiKey, 'Content-Type': 'application/json' }
    const vol = await (await fetch(`${apiURL(0)}/volumes`, { method: 'POST', headers: key, body: JSON.stringify({ name: `${run}-vol` }) })).json()
    try {
      // The page's upload and delete calls (web/team.js), from api B's page.
      await open(page, `${apiURL(1)}/dashboard/#/volumes`, '#volumes')
      const door = (method, route, body) => page.evaluate(async (m, r, b) => {
        const res = await fetch(`/dashboard/api${r}`, { method: m, body: b, headers: { 'X-Warren-Dashboard': '1' }, credentials: 'same-origin' })
        return [res.status, await res.text()]
      }, method, route, body)
      const base = `/volumecontent/${vol.volumeID}`
      expect((await door('PUT', `${base}/file?path=${encodeURIComponent('/docs/up.txt')}&force=true`, `through api B ${run}`))[0]).toBe(201)
      const bearer = { Authorization: `Bearer ${vol.token}` }
      const read = await fetch(`${apiURL(0)}${base}/file?path=/docs/up.txt`, { headers: bearer })
      expect(await read.text()).toBe(`through api B ${run}`)
      const [status, listing] = await door('GET', `${base}/dir?path=/docs`)
      expect(status).toBe(200)
      expect(listing).toContain('up.txt')
      // Team B's session, through either api: the volume is not there.
      const ctx = await browser.createBrowserContext()
      try {
        const p = await ctx.newPage()
        watch(p)
        await signIn(p, apiURL(1), otherKey, '#sandboxes')
        for (const i of [1, 0]) {
          // Cookies ignore ports: the session reaches api A too.
          if (i === 0) await open(p, `${apiURL(0)}/dashboard/#/sandboxes`, '#sandboxes')
          const got = await p.evaluate(async (r) => {
            const h = { 'X-Warren-Dashboard': '1' }
            return [(await fetch(`/dashboard/api${r}/dir?path=/`, { headers: h })).status,
              (await fetch(`/dashboard/api${r}/file?path=/docs/up.txt`, { method: 'PUT', body: 'x', headers: h })).status]
          }, base)
          expect(got, `team B through api ${i}`).toEqual([404, 404])
        }
      } finally {
        await ctx.close()
      }
      expect((await door('DELETE', `${base}/path?path=${encodeURIComponent('/docs/up.txt')}`))[0]).toBe(204)
      expect((await fetch(`${apiURL(0)}${base}/path?path=/docs/up.txt`, { headers: bearer })).status).toBe(404)
      // E2B's dashboard-api (what its dashboard calls with the key), the
      // same answer through both apis, and team-scoped.
      const dash = (i, route, apiKey = c.apiKey) => fetch(`${apiURL(i)}/dashboard-api${route}`, { headers: { 'X-API-Key': apiKey } })
      const lists = []
      for (const i of [0, 1]) {
        expect((await dash(i, '/health')).status).toBe(200)
        const res = await dash(i, '/templates')
        expect(res.status, `dashboard-api templates through api ${i}`).toBe(200)
        lists.push(await res.json())
      }
      expect(lists[1]).toEqual(lists[0])
      expect((await dash(1, '/templates', 'e2b_' + '0'.repeat(40))).status).toBe(401)
    } finally {
      await fetch(`${apiURL(0)}/volumes/${vol.volumeID}`, { method: 'DELETE', headers: key })
    }
  })

  test('kill from the list through api A; the SDK sees it gone', async () => {
    const row = `tr[data-id="${sbx.sandboxId}"]`
    await open(page, `${apiURL(0)}/dashboard/#/sandboxes`, `${row} button.kill`)
    await page.click(`${row} button.kill`)
    await page.waitForFunction((id) => !document.querySelector(`tr[data-id="${id}"]`), { timeout: 15_000 }, sbx.sandboxId)
    expect(await sbx.isRunning()).toBe(false)
    await expect(Sandbox.getInfo(sbx.sandboxId, c.apis[1].opts)).rejects.toThrow()
  })

  test('the nodes page on an api\'s admin listener: both nodes; cordon and drain from the page reach the store and the node', async () => {
    const adminToken = readFileSync(path.join(c.apis[0].dataDir, 'admin-token'), 'utf8').trim()
    const ctx = await browser.createBrowserContext()
    try {
      const p = await ctx.newPage()
      p.on('dialog', (d) => d.accept())
      watch(p)
      await signIn(p, adminUrl, adminToken, '#nodes')
      await open(p, `${adminUrl}/dashboard/#/nodes`, '#nodes tr[data-name="dnb"]')
      for (const n of ['dna', 'dnb']) await p.waitForSelector(`#nodes tr[data-name="${n}"][data-state="ready"]`, { timeout: 15_000 })
      expect(await p.$eval('#nodes tr[data-name="dna"]', (r) => r.textContent)).toContain(`127.0.0.1:${c.nodes.dna.port}`)
      await shot('nodes', p)
      // Cordon the node without team B's sandbox, then uncordon it.
      const busy = c.nodeOf(other.sandboxId)
      const idle = busy === 'dna' ? 'dnb' : 'dna'
      await p.click(`#nodes tr[data-name="${idle}"] button.cordon`)
      await p.waitForSelector(`#nodes tr[data-name="${idle}"][data-state="cordoned"]`)
      expect(c.nodeRow(idle)[1]).toBe('cordoned')
      await p.click(`#nodes tr[data-name="${idle}"] button.uncordon`)
      await p.waitForSelector(`#nodes tr[data-name="${idle}"][data-state="ready"]`)
      expect(c.nodeRow(idle)[1]).toBe('ready')
      // Drain the node that runs team B's sandbox: the node pauses it.
      await p.click(`#nodes tr[data-name="${busy}"] button.drain`)
      await p.waitForSelector(`#nodes tr[data-name="${busy}"][data-state="draining"]`)
      expect(c.nodeRow(busy)[1]).toBe('draining')
      const opts = { ...c.apis[1].opts, apiKey: otherKey }
      let state
      for (const end = Date.now() + 30_000; Date.now() < end; await sleep(250)) {
        state = (await Sandbox.getInfo(other.sandboxId, opts)).state
        if (state === 'paused') break
      }
      expect(state).toBe('paused')
      await shot('nodes-draining', p)
    } finally {
      await ctx.close()
    }
  })
})
