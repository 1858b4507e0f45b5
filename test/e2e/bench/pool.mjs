// The adaptive warm pool (issue 16): a steady stream of creates through
// the official SDK against a real `warren serve` (runsc, default pool
// settings but for POOL_SIZE), each sandbox killed after its first
// commands.run('true'). Reports how many creates found the pool empty
// (the server's own "sandbox created … warm=false" debug lines) and
// create → first command p50/p99. Bounded: POOL_RATE creates/s (default
// 5) for POOL_SECONDS (default 60), at most 50 in flight (a create that
// would exceed it is counted as skipped), and a drain of at most 60 s.
import { Sandbox } from 'e2b'
import { startWarren, killAll } from '../setup/start-warren.mjs'
import { Table } from './stats.mjs'

const RATE = Number(process.env.POOL_RATE || 5)
const SECONDS = Number(process.env.POOL_SECONDS || 60)
const POOL_SIZE = Number(process.env.POOL_SIZE || 2)
const MAX_IN_FLIGHT = 50
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))
const sorted = (xs) => [...xs].sort((a, b) => a - b)

// warmFlags reads the server's "sandbox created" lines: sandbox ID → warm.
function warmFlags(output) {
  const out = new Map()
  for (const m of output.matchAll(/msg="sandbox created" sandbox=(\S+) warm=(\S+)/g)) out.set(m[1], m[2] === 'true')
  return out
}

async function once(conn) {
  const t0 = performance.now()
  const sbx = await Sandbox.create(conn)
  const t1 = performance.now()
  try {
    await sbx.commands.run('true')
    return { id: sbx.sandboxId, create: t1 - t0, total: performance.now() - t0 }
  } finally {
    await sbx.kill().catch(() => {})
  }
}

const w = await startWarren({ instance: 'bpol', net16: 137, poolSize: POOL_SIZE, extraArgs: ['--log-level', 'debug'] })
const conn = { apiUrl: w.apiUrl, sandboxUrl: w.sandboxUrl, apiKey: w.apiKey }
const table = new Table()
try {
  await sleep(3000) // the floor of the pool fills
  const runs = []
  const errors = []
  let inFlight = 0
  let skipped = 0
  const pending = []
  const start = performance.now()
  const total = Math.round(RATE * SECONDS)
  for (let i = 0; i < total; i++) {
    const due = start + (i * 1000) / RATE
    const wait = due - performance.now()
    if (wait > 0) await sleep(wait)
    if (inFlight >= MAX_IN_FLIGHT) { skipped++; continue }
    inFlight++
    pending.push(once(conn).then((r) => runs.push(r), (e) => errors.push(String(e?.message || e))).finally(() => inFlight--))
  }
  const wall = (performance.now() - start) / 1000
  await Promise.race([Promise.allSettled(pending), sleep(60_000)])
  const flags = warmFlags(w.output())
  const cold = runs.filter((r) => flags.get(r.id) === false).length
  const unknown = runs.filter((r) => !flags.has(r.id)).length
  console.log(`${runs.length} creates in ${wall.toFixed(1)} s (${RATE}/s for ${SECONDS} s, --pool-size ${POOL_SIZE}): ` +
    `${cold} found the pool empty, ${errors.length} failed, ${skipped} skipped (over ${MAX_IN_FLIGHT} in flight), ${unknown} without a server trace`)
  if (errors.length) console.error([...new Set(errors)].slice(0, 5).join('\n'))
  table.latency(`create → first commands.run(true), ${RATE}/s steady`, sorted(runs.map((r) => r.total)), 'pool never empty')
  table.latency('  Sandbox.create (SDK)', sorted(runs.map((r) => r.create)))
  table.latency('  of which the pool was empty (cold)', sorted(runs.filter((r) => flags.get(r.id) === false).map((r) => r.total)))
  const targets = [...w.output().matchAll(/msg="warm pool resized" template=base target=(\d+)/g)].map((m) => Number(m[1]))
  if (targets.length) console.log(`base pool target: max ${Math.max(...targets)}, last ${targets[targets.length - 1]}`)
} finally {
  await killAll(w).catch(() => {})
  await w.stop({ removeDataDir: true })
}
table.print()
