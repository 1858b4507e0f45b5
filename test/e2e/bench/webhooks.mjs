// Benchmarks lifecycle event delivery (issue 25) against a real `warren
// serve` with loopback receivers (--webhook-allow-cidr 127.0.0.0/8):
// event → delivery latency (the event's commit timestamp to the
// receiver's arrival, one clock) while events come at WEBHOOK_RATE per
// minute (default 1000: setTimeout calls on a few sandboxes, each an
// `updated` event) for WEBHOOK_SECONDS (default 30), first to a healthy
// endpoint alone, then beside a slow one (answers after 10 s) of another
// webhook. Loops are bounded in count and time. Prints one table.
import http from 'node:http'
import { Sandbox } from 'e2b'
import { startWarren, killAll } from '../setup/start-warren.mjs'
import { Table } from './stats.mjs'

const rate = Number(process.env.WEBHOOK_RATE || 1000) // events per minute
const seconds = Number(process.env.WEBHOOK_SECONDS || 30)
const sandboxes = 4
const table = new Table()

const arrivals = { healthy: [], slow: [] } // latency ms of each arrival
const slowHeld = new Set()
const receiver = http.createServer((req, res) => {
  const chunks = []
  req.on('data', (c) => chunks.push(c))
  req.on('end', () => {
    const now = Date.now()
    const ev = JSON.parse(Buffer.concat(chunks).toString('utf8'))
    const lat = now - Date.parse(ev.timestamp)
    if (req.url === '/slow') {
      arrivals.slow.push(lat)
      const t = setTimeout(() => { slowHeld.delete(t); res.writeHead(200).end() }, 10_000)
      slowHeld.add(t)
      return
    }
    arrivals.healthy.push(lat)
    res.writeHead(200).end()
  })
})
await new Promise((r) => receiver.listen(0, '127.0.0.1', r))
const base = `http://127.0.0.1:${receiver.address().port}`

// --webhook-timeout 15s: the slow endpoint's 10 s answers count as answers.
const w = await startWarren({ instance: 'bwh', net16: 161, poolSize: 0,
  extraArgs: ['--webhook-allow-cidr', '127.0.0.0/8', '--webhook-timeout', '15s', '--api-rate-limit', '0'] })
const conn = { apiUrl: w.apiUrl, sandboxUrl: w.sandboxUrl, apiKey: w.apiKey }
const api = (method, path, body, key = w.apiKey) => fetch(w.apiUrl + path, {
  method, headers: { 'X-API-Key': key, 'Content-Type': 'application/json' }, body: body && JSON.stringify(body),
}).then(async (r) => ({ status: r.status, body: await r.json().catch(() => undefined) }))

const events = ['sandbox.lifecycle.updated']
const addHook = async (path, key = w.apiKey) => {
  const r = await api('POST', '/events/webhooks', { name: path, url: base + path, enabled: true, events, signatureSecret: 'bench' }, key)
  if (r.status !== 201) throw new Error(`webhook ${path}: ${r.status} ${JSON.stringify(r.body)}`)
  return r.body
}

// drive makes rate/min setTimeout calls over the sandboxes for seconds.
async function drive(sbxs) {
  const interval = 60_000 / rate
  const end = Date.now() + seconds * 1000
  let i = 0
  const pending = []
  for (let next = Date.now(); next < end; next += interval, i++) {
    const wait = next - Date.now()
    if (wait > 0) await new Promise((r) => setTimeout(r, wait))
    pending.push(sbxs[i % sbxs.length].setTimeout(300_000 + (i % 1000) * 10).catch(() => {}))
  }
  await Promise.all(pending)
  return i
}

async function settle(want, ms = 30_000) {
  const end = Date.now() + ms
  while (arrivals.healthy.length < want && Date.now() < end) await new Promise((r) => setTimeout(r, 100))
}

try {
  const sbxs = await Promise.all(Array.from({ length: sandboxes }, () => Sandbox.create({ ...conn, timeoutMs: 600_000 })))
  await addHook('/healthy')

  let sent = await drive(sbxs)
  await settle(sent)
  table.latency(`healthy endpoint alone, ${rate}/min for ${seconds} s`, arrivals.healthy, 'p50 ≤ 50')
  const alone = arrivals.healthy.length

  // A second webhook, whose endpoint answers after 10 s, takes the same
  // events: it has a worker (and a queue) of its own.
  arrivals.healthy.length = 0
  await addHook('/slow')
  sent = await drive(sbxs)
  await settle(sent)
  table.latency(`healthy endpoint beside a 10 s one, ${rate}/min for ${seconds} s`, arrivals.healthy, 'unchanged')
  table.count('slow endpoint: attempts that reached it meanwhile', [arrivals.slow.length])
  table.count('healthy deliveries (alone, beside the slow one)', [alone, arrivals.healthy.length])
} finally {
  for (const t of slowHeld) clearTimeout(t)
  receiver.closeAllConnections()
  receiver.close()
  await killAll(w).catch(() => {})
  await w.stop({ removeDataDir: true })
}
table.print()
