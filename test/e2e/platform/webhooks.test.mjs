// Lifecycle events and signed webhooks (issue 25), as E2B serves them:
// the official SDK drives the sandboxes, fetch the /events API, and a
// receiver on loopback checks what arrives. The server is this file's own
// (--webhook-allow-cidr 127.0.0.0/8, short retries), so that it can be
// killed with SIGKILL and restarted.
import http from 'node:http'
import crypto from 'node:crypto'
import { afterAll, beforeAll, expect, test } from 'vitest'
import { Sandbox } from 'e2b'
import { startWarren, killAll } from '../setup/start-warren.mjs'

const serverArgs = ['--webhook-allow-cidr', '127.0.0.0/8', '--webhook-retry-interval', '300ms', '--pool-size', '0']
const instance = { instance: 'whk', net16: 161, poolSize: 0 }
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

let w
let receiver
let base // the receiver's URL
const got = {} // path → [{ headers, raw, event }]
const behaviour = {} // path → (event, n) → status, or a promise of one

beforeAll(async () => {
  receiver = http.createServer((req, res) => {
    const chunks = []
    req.on('data', (c) => chunks.push(c))
    req.on('end', async () => {
      const raw = Buffer.concat(chunks).toString('utf8')
      const event = JSON.parse(raw)
      const list = (got[req.url] ??= [])
      list.push({ headers: req.headers, raw, event })
      const status = await (behaviour[req.url]?.(event, list.length) ?? 200)
      res.writeHead(status).end()
    })
  })
  await new Promise((r) => receiver.listen(0, '127.0.0.1', r))
  base = `http://127.0.0.1:${receiver.address().port}`
  w = await startWarren({ ...instance, extraArgs: serverArgs })
})

afterAll(async () => {
  if (w) {
    await killAll(w).catch(() => {})
    await w.stop({ removeDataDir: true })
  }
  receiver?.closeAllConnections()
  receiver?.close()
})

const opts = () => ({ apiUrl: w.apiUrl, sandboxUrl: w.sandboxUrl, apiKey: w.apiKey })
const api = async (method, path, body) => {
  const res = await fetch(w.apiUrl + path, {
    method, headers: { 'X-API-Key': w.apiKey, ...(body ? { 'Content-Type': 'application/json' } : {}) },
    body: body ? JSON.stringify(body) : undefined,
  })
  const text = await res.text()
  return { status: res.status, body: text ? JSON.parse(text) : undefined }
}
const hook = async (path, events, extra = {}) => {
  const res = await api('POST', '/events/webhooks', {
    name: path, url: base + path, enabled: true, events, signatureSecret: `secret-${path}`, ...extra,
  })
  expect(res.status, JSON.stringify(res.body)).toBe(201)
  expect(JSON.stringify(res.body)).not.toContain('secret-')
  return res.body
}
// waitFor polls until check() returns a truthy value (bounded).
const waitFor = async (what, check, ms = 20_000) => {
  const deadline = Date.now() + ms
  for (;;) {
    const v = check()
    if (v) return v
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}: ${JSON.stringify(got, null, 1).slice(0, 2000)}`)
    await sleep(50)
  }
}
const of = (path, sandboxId) => (got[path] ?? []).filter((g) => g.event.sandboxId === sandboxId)
const short = (t) => t.replace('sandbox.lifecycle.', '')
const sign = (secret, raw) => crypto.createHash('sha256').update(secret + raw).digest('base64').replace(/=+$/, '')

test('a sandbox\'s lifecycle reaches the receiver signed and in order; a 500 is retried with the same id; disabled and deleted webhooks get nothing; polling serves the same events', async () => {
  const all = await hook('/all', ['sandbox.lifecycle.created', 'sandbox.lifecycle.updated', 'sandbox.lifecycle.paused',
    'sandbox.lifecycle.resumed', 'sandbox.lifecycle.checkpointed', 'sandbox.lifecycle.killed'])
  const failedOnce = new Set() // each event's first attempt gets a 500
  behaviour['/flaky'] = (event) => (failedOnce.has(event.id) ? 200 : (failedOnce.add(event.id), 500))
  await hook('/flaky', ['sandbox.lifecycle.created'])
  await hook('/disabled', ['sandbox.lifecycle.created', 'sandbox.lifecycle.killed'], { enabled: false })
  const gone = await hook('/deleted', ['sandbox.lifecycle.created', 'sandbox.lifecycle.killed'])
  expect((await api('DELETE', `/events/webhooks/${gone.id}`)).status).toBe(204)

  // A second sandbox times out meanwhile: its kill is the reaper's.
  const brief = await Sandbox.create({ ...opts(), timeoutMs: 3_000 })
  const sbx = await Sandbox.create({ ...opts(), metadata: { run: 'webhooks' } })
  await sbx.setTimeout(120_000)
  expect(await sbx.pause()).toBe(true)
  await Sandbox.connect(sbx.sandboxId, opts()) // resumes
  await sbx.createSnapshot()
  await sbx.kill()

  const want = ['created', 'updated', 'paused', 'resumed', 'checkpointed', 'killed']
  const received = await waitFor('the lifecycle at /all', () => of('/all', sbx.sandboxId).length >= want.length && of('/all', sbx.sandboxId))
  expect(received.map((g) => short(g.event.type))).toEqual(want)
  for (const g of received) {
    expect(g.headers['e2b-webhook-id']).toBe(all.id)
    expect(g.headers['e2b-signature-version']).toBe('v1')
    expect(g.headers['e2b-delivery-id']).toMatch(/^[0-9a-f-]{36}$/)
    expect(g.headers['e2b-signature']).toBe(sign('secret-/all', g.raw))
    expect(g.event).toMatchObject({ version: 'v2', sandboxId: sbx.sandboxId, sandboxTemplateId: expect.any(String) })
    expect(g.event.eventData.sandbox_metadata).toEqual({ run: 'webhooks' })
  }
  for (const i of [2, 5]) expect(received[i].event.eventData.execution).toMatchObject({ vcpu_count: expect.any(Number), memory_mb: expect.any(Number) })
  expect(received[1].event.eventData.set_timeout).toBeTruthy()

  const flaky = await waitFor('the retry at /flaky', () => of('/flaky', sbx.sandboxId).length >= 2 && of('/flaky', sbx.sandboxId))
  expect(flaky[0].event.id).toBe(flaky[1].event.id)
  expect(flaky[0].headers['e2b-delivery-id']).not.toBe(flaky[1].headers['e2b-delivery-id'])
  expect(flaky[0].raw).toBe(flaky[1].raw)

  const reaped = await waitFor('the timeout kill', () => of('/all', brief.sandboxId).find((g) => g.event.type === 'sandbox.lifecycle.killed'))
  expect(reaped.event.eventData.execution).toBeTruthy()
  expect(got['/disabled']).toBeUndefined()
  expect(got['/deleted']).toBeUndefined()

  // Polling lists the same events: newest first by default, oldest
  // first with orderAsc, by types, paged by limit and offset.
  const ids = received.map((g) => g.event.id)
  const asc = await api('GET', `/events/sandboxes/${sbx.sandboxId}?orderAsc=true&limit=100`)
  expect(asc.status).toBe(200)
  expect(asc.body.map((e) => e.id)).toEqual(ids)
  expect(asc.body[0]).toEqual(received[0].event)
  const desc = await api('GET', `/events/sandboxes/${sbx.sandboxId}`)
  expect(desc.body.map((e) => e.id)).toEqual([...ids].reverse())
  const page = await api('GET', `/events/sandboxes/${sbx.sandboxId}?orderAsc=true&offset=2&limit=2`)
  expect(page.body.map((e) => e.id)).toEqual(ids.slice(2, 4))
  const typed = await api('GET', `/events/sandboxes/${sbx.sandboxId}?orderAsc=true&types=sandbox.lifecycle.killed&types=sandbox.lifecycle.created`)
  expect(typed.body.map((e) => short(e.type))).toEqual(['created', 'killed'])
  const team = await api('GET', '/events/sandboxes?limit=100&types=sandbox.lifecycle.killed')
  expect(team.body.map((e) => e.sandboxId).sort()).toEqual([sbx.sandboxId, brief.sandboxId].sort())
  expect((await api('GET', '/events/sandboxes?limit=101')).status).toBe(400)
  expect((await api('GET', '/events/sandboxes/nosuchsandbox')).status).toBe(404)

  // The deliveries listing shows the failed attempt and its retry.
  const deliveries = await api('GET', `/events/webhooks/${all.id}/deliveries?limit=100`)
  expect(deliveries.status).toBe(200)
  expect(deliveries.body.filter((d) => d.status === 200).length).toBeGreaterThanOrEqual(want.length)
})

test('bad webhook input is refused with 400; another team\'s or an unknown webhook is 404', async () => {
  const bad = [
    { url: 'http://169.254.169.254/latest/meta-data/' }, { url: 'http://10.0.0.1/' }, { url: 'ftp://example.com/' },
    { events: [] }, { events: ['sandbox.lifecycle.exploded'] }, { signatureSecret: '' },
  ]
  for (const b of bad) {
    const res = await api('POST', '/events/webhooks', { name: 'x', url: base + '/x', enabled: true, events: ['sandbox.lifecycle.created'], signatureSecret: 's', ...b })
    expect(res.status, JSON.stringify(b)).toBe(400)
    expect(res.body.code).toBe(400)
  }
  const res = await api('GET', '/events/webhooks/00000000-0000-0000-0000-000000000000')
  expect(res.status).toBe(404)
  expect(res.body.code).toBe(404)
})

test('kill -9 between a state change and its delivery: the event is delivered after the restart, with the same id', async () => {
  let hang = true
  const held = []
  behaviour['/crash'] = () => (hang ? new Promise((r) => held.push(r)) : 200)
  await hook('/crash', ['sandbox.lifecycle.updated'])
  const sbx = await Sandbox.create(opts())
  await sbx.setTimeout(90_000) // committed with its event; the delivery hangs
  const first = await waitFor('the first attempt at /crash', () => of('/crash', sbx.sandboxId)[0])

  const dataDir = w.dataDir
  process.kill(w.pid, 'SIGKILL')
  await w.stop()
  hang = false
  for (const r of held) r(200) // too late: its server is gone
  w = await startWarren({ ...instance, dataDir, extraArgs: serverArgs })

  const again = await waitFor('the delivery after the restart', () => of('/crash', sbx.sandboxId)[1])
  expect(again.event.id).toBe(first.event.id)
  expect(again.headers['e2b-signature']).toBe(sign('secret-/crash', again.raw))
  expect(await Sandbox.kill(sbx.sandboxId, opts())).toBe(true)
})
