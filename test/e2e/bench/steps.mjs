// The performance baseline (issue 16): the end-to-end figures of a fresh
// `warren serve` (runsc, default settings) measured with the official SDK,
// and each create broken into its steps as the server itself timed them
// (its debug log line "sandbox created … steps=name=ms,…", written by
// internal/steptrace marks on the real code path), and a command broken
// into the proxy hop, envd's RPC and the process. Run by `make bench`;
// every loop is bounded in count and time. N (env BENCH_N, default 30)
// is the sample count of each sequential figure.
import { Sandbox } from 'e2b'
import { startWarren, killAll } from '../setup/start-warren.mjs'
import { measure, percentile, Table } from './stats.mjs'

const N = Number(process.env.BENCH_N || 30)
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

async function withWarren(opts, fn) {
  const w = await startWarren({ instance: 'bstp', net16: 135, ...opts, extraArgs: ['--log-level', 'debug', ...(opts.extraArgs || [])] })
  const conn = { apiUrl: w.apiUrl, sandboxUrl: w.sandboxUrl, apiKey: w.apiKey }
  try {
    await fn(w, conn)
  } finally {
    await killAll(w).catch(() => {})
    await w.stop({ removeDataDir: true })
    const problems = w.output().split('\n').filter((l) => /level=(WARN|ERROR)/.test(l))
    if (problems.length) console.error(problems.join('\n'))
  }
}

// serverSteps reads the server's step traces: for "sandbox created" lines
// {id, warm, envd, steps: {name: ms}}, for "warm sandbox ready" lines the
// same without warm and envd.
function serverSteps(output, msg) {
  const re = new RegExp(`msg="${msg}" sandbox=(\\S+)(?: warm=(\\S+) envd=(\\S+))?(?: template=\\S+)? steps="?([^"\\s]+)`)
  const out = new Map()
  for (const line of output.split('\n')) {
    const m = re.exec(line)
    if (!m) continue
    const steps = Object.fromEntries(m[4].split(',').map((kv) => kv.split('=')).map(([k, v]) => [k, Number(v)]))
    out.set(m[1], { id: m[1], warm: m[2] === 'true', envd: m[3], steps })
  }
  return out
}

// stepRows adds a row per step (in first-seen order) of the traces, and
// their sum as "server total".
function stepRows(table, label, traces) {
  const names = []
  for (const t of traces) for (const k of Object.keys(t.steps)) if (!names.includes(k)) names.push(k)
  const sorted = (xs) => xs.filter((x) => x !== undefined).sort((a, b) => a - b)
  for (const k of names) table.latency(`  ${label}: ${k}`, sorted(traces.map((t) => t.steps[k])))
  table.latency(`  ${label}: server total`, sorted(traces.map((t) => Object.values(t.steps).reduce((a, b) => a + b, 0))))
  // envd's /init runs after the create has answered (the proxy holds the
  // sandbox's traffic until it is done): the answer waits for the rest.
  if (names.includes('envd-init')) {
    table.latency(`  ${label}: server total until the answer (all but envd-init)`,
      sorted(traces.map((t) => Object.entries(t.steps).filter(([k]) => k !== 'envd-init').reduce((a, [, v]) => a + v, 0))))
  }
}

// createThenCommand times Sandbox.create and the first commands.run('true').
async function createThenCommand(conn) {
  const t0 = performance.now()
  const sbx = await Sandbox.create(conn)
  const t1 = performance.now()
  await sbx.commands.run('true')
  const t2 = performance.now()
  await sbx.kill()
  return { id: sbx.sandboxId, create: t1 - t0, command: t2 - t1, total: t2 - t0 }
}

// sequential runs createThenCommand n times with pauseMs between (bounded
// by budgetMs) and returns the samples.
async function sequential(conn, n, pauseMs, budgetMs) {
  const deadline = Date.now() + budgetMs
  const out = []
  await createThenCommand(conn) // warm-up run
  while (out.length < n && Date.now() < deadline) {
    out.push(await createThenCommand(conn))
    await sleep(pauseMs)
  }
  return out
}

const sorted = (xs) => [...xs].sort((a, b) => a - b)
const table = new Table()

// 1. Default settings (pool of 2): sequential creates → first command.
//    The pause lets the pool refill (a runsc start and warm-up take ~0.3 s).
await withWarren({ poolSize: 2 }, async (w, conn) => {
  await sleep(2000)
  const runs = await sequential(conn, N, 600, 120_000)
  table.latency('create → first commands.run(true), sequential, pool 2', sorted(runs.map((r) => r.total)), 'p50 ≤ 25, p99 ≤ 60')
  table.latency('  Sandbox.create (SDK)', sorted(runs.map((r) => r.create)))
  table.latency('  first commands.run(true) (SDK)', sorted(runs.map((r) => r.command)))
  const created = serverSteps(w.output(), 'sandbox created')
  const traces = runs.map((r) => created.get(r.id)).filter(Boolean)
  const warm = traces.filter((t) => t.warm)
  console.error(`pool 2, sequential: ${warm.length} of ${traces.length} creates found a warm sandbox`)
  stepRows(table, `server steps, warm claim (${warm.length}/${traces.length})`, warm)
  if (warm.length < traces.length) stepRows(table, 'server steps, pool empty', traces.filter((t) => !t.warm))
  stepRows(table, 'pool refill', [...serverSteps(w.output(), 'warm sandbox ready').values()])

  // POST /v2/sandboxes alone (what Sandbox.create sends), warm pool.
  const headers = { 'X-API-Key': w.apiKey, 'Content-Type': 'application/json' }
  const post = await measure(async () => {
    const t0 = performance.now()
    const res = await fetch(`${w.apiUrl}/v2/sandboxes`, { method: 'POST', headers, body: JSON.stringify({ templateID: 'base', timeout: 300 }) })
    const ms = performance.now() - t0
    const body = await res.json()
    if (res.status !== 201) throw new Error(`POST /v2/sandboxes: ${res.status} ${JSON.stringify(body)}`)
    await fetch(`${w.apiUrl}/sandboxes/${body.sandboxID}`, { method: 'DELETE', headers: { 'X-API-Key': w.apiKey } })
    await sleep(600)
    return ms
  }, { n: N, warmup: 1, sample: true, budgetMs: 90_000 })
  table.latency('POST /v2/sandboxes, warm pool', post, 'p50 ≤ 5')

  // A command in a running sandbox: through the proxy (as users run it)
  // and straight to envd on the slot's address (the SDK's sandboxUrl
  // pointed there): the difference is the proxy hop.
  const sbx = await Sandbox.create(conn)
  try {
    // The line is written once envd's /init, which follows the answer, is done.
    let created
    for (const until = Date.now() + 10_000; !(created = serverSteps(w.output(), 'sandbox created').get(sbx.sandboxId)) && Date.now() < until;) await sleep(20)
    if (!created) throw new Error(`no "sandbox created" line for ${sbx.sandboxId}`)
    const envd = created.envd
    const direct = await Sandbox.connect(sbx.sandboxId, { ...conn, sandboxUrl: envd })
    // Interleaved, so that drift in the machine's load hits both alike.
    const time = async (fn) => { const t0 = performance.now(); await fn(); return performance.now() - t0 }
    const s = { proxyRun: [], directRun: [], proxyStat: [], directStat: [], started: [] }
    for (let i = 0; i < 5; i++) { await sbx.commands.run('true'); await direct.commands.run('true') }
    const deadline = Date.now() + 60_000
    for (let i = 0; i < N * 3 && Date.now() < deadline; i++) {
      s.proxyRun.push(await time(() => sbx.commands.run('true')))
      s.directRun.push(await time(() => direct.commands.run('true')))
      s.proxyStat.push(await time(() => sbx.files.exists('/')))
      s.directStat.push(await time(() => direct.files.exists('/')))
      const t0 = performance.now()
      const h = await direct.commands.run('true', { background: true })
      s.started.push(performance.now() - t0)
      await h.wait()
    }
    for (const k of Object.keys(s)) s[k].sort((a, b) => a - b)
    table.latency('commands.run(true) round trip, running sandbox', s.proxyRun, 'p50 ≤ 12')
    table.latency('  same, straight to envd (no proxy)', s.directRun)
    table.latency('  files.exists(/) (envd RPC, no process), through the proxy', s.proxyStat)
    table.latency('  files.exists(/) (envd RPC, no process), straight', s.directStat)
    table.latency('  proxy hop: p50 difference of files.exists', [percentile(s.proxyStat, 50) - percentile(s.directStat, 50)])
    table.latency('  commands.run(true, background) → start event, straight', s.started)
  } finally {
    await sbx.kill()
  }
})

// 2. No warm pool: every create boots a sandbox.
await withWarren({ poolSize: 0 }, async (w, conn) => {
  const runs = await sequential(conn, N, 0, 120_000)
  table.latency('create (pool 0) → first commands.run(true)', sorted(runs.map((r) => r.total)), 'p50 ≤ 120')
  table.latency('  Sandbox.create (SDK)', sorted(runs.map((r) => r.create)))
  table.latency('  first commands.run(true) (SDK)', sorted(runs.map((r) => r.command)))
  const created = serverSteps(w.output(), 'sandbox created')
  stepRows(table, 'server steps, cold', runs.map((r) => created.get(r.id)).filter(Boolean))
})

// 3. Bursts of 20 concurrent creates on a fresh server with default
// settings, each sandbox running its first command: the first burst
// finds the pool at its floor; the later ones (3 s apart) find what the
// pool kept for a batch of that size. A create answers before its envd is
// initialised, so the wall to the first commands is what a user waits.
await withWarren({ poolSize: 2 }, async (w, conn) => {
  const creates = []
  const withCommand = []
  const ids = []
  for (let round = 0; round < 4; round++) {
    await sleep(3000) // the pool refills
    const t0 = performance.now()
    let lastCreate = 0
    const sbxs = await Promise.all(Array.from({ length: 20 }, async () => {
      const s = await Sandbox.create(conn)
      lastCreate = Math.max(lastCreate, performance.now())
      await s.commands.run('true')
      return s
    }))
    withCommand.push(performance.now() - t0)
    creates.push(lastCreate - t0)
    ids.push(sbxs.map((s) => s.sandboxId))
    await Promise.all(sbxs.map((s) => s.kill()))
  }
  const created = serverSteps(w.output(), 'sandbox created')
  const warmOf = (round) => ids[round].filter((id) => created.get(id)?.warm).length
  table.latency('20 concurrent creates, wall, first burst (pool 2)', [creates[0]], '≤ 1000')
  table.latency('  the same + each one\'s first commands.run(true)', [withCommand[0]])
  table.count('  warm claims in it (of 20)', [warmOf(0)])
  table.latency('20 concurrent creates, wall, 3 later bursts 3 s apart', sorted(creates.slice(1)), '≤ 1000')
  table.latency('  the same + each one\'s first commands.run(true)', sorted(withCommand.slice(1)))
  table.count('  warm claims in them (of 20 each)', [1, 2, 3].map(warmOf))
  stepRows(table, 'server steps, 20 at once', ids.flat().map((id) => created.get(id)).filter(Boolean))
})

table.print()
