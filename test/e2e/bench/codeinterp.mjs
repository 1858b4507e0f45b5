// The code interpreter (issue 23) through the official @e2b/code-interpreter
// SDK against a real `warren serve` with the code-interpreter-v1 template
// (`warren setup` builds it): create → first runCode('1') (cold, then from
// the template's warm pool), a cell's round trip against commands.run('true')
// on the same sandbox (A/B, interleaved), a matplotlib plot with its chart,
// and what an idle code-interpreter sandbox holds (its cgroup's memory, as
// getMetrics reports it). Loops are bounded in count and time.
// The first create boots the template; the others come after the server
// has taken the template's start snapshot (running kernels), which they
// restore. CI_BENCH_POOL=0 (default 2) times creates without a warm pool:
// each one restores the snapshot.
import { readFileSync } from 'node:fs'
import path from 'node:path'
import { Sandbox } from '@e2b/code-interpreter'
import { startWarren, killAll } from '../setup/start-warren.mjs'
import { measure, Table } from './stats.mjs'

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))
// GAP_MS is the pause between the timed creates: a warm code-interpreter
// sandbox is ready once its kernel has started (seconds).
const GAP_MS = Number(process.env.CI_BENCH_GAP_MS || 3000)
const table = new Table()
const POOL = Number(process.env.CI_BENCH_POOL ?? 2)
const w = await startWarren({ instance: 'bci', net16: 145, poolSize: POOL, ciSnapshot: true })
const started = performance.now()
const conn = { apiUrl: w.apiUrl, sandboxUrl: w.sandboxUrl, apiKey: w.apiKey, timeoutMs: 300_000 }

// createToCell times Sandbox.create + the first runCode('1'), then kills
// the sandbox (not timed).
async function createToCell() {
  const t0 = performance.now()
  const sbx = await Sandbox.create(conn)
  const r = await sbx.runCode('1')
  const ms = performance.now() - t0
  await sbx.kill()
  if (r.text !== '1') throw new Error(`runCode('1') gave ${JSON.stringify(r.text)}`)
  return ms
}

// waitSnapshot waits (bounded) until the server has recorded the
// template's start snapshot and returns the seconds since its start, or
// null if it did not within 3 minutes (a runtime without checkpoints).
async function waitSnapshot() {
  const file = path.join(w.dataDir, 'templates', 'code-interpreter-v1.json')
  const deadline = Date.now() + 180_000
  while (Date.now() < deadline) {
    if (JSON.parse(readFileSync(file, 'utf8')).snapshot) return (performance.now() - started) / 1000
    await sleep(250)
  }
  return null
}

const plot = `
import matplotlib.pyplot as plt
plt.figure()
plt.plot([1, 2, 3, 4], [1, 4, 9, 16], label='squares')
plt.title('squares'); plt.xlabel('x'); plt.ylabel('y')
plt.show()
`

try {
  table.latency('create → first runCode(1), cold, booted (before the start snapshot)', [await createToCell()])
  const snapAt = await waitSnapshot()
  const snapCell = snapAt === null ? '-' : snapAt.toFixed(1)
  table.rows.push(['start snapshot recorded, after the server\'s start', snapAt === null ? '0' : '1', snapCell, snapCell, 's', ''])
  // The first create made the template's pool; let it fill with restored
  // sandboxes.
  await sleep(10_000)
  const kind = POOL > 0 ? 'warm pool' : 'no pool: restored'
  table.latency(`create → first runCode(1), ${kind}, ${GAP_MS / 1000} s apart`, await measure(async () => {
    const ms = await createToCell()
    await sleep(GAP_MS) // the pool refills between creates
    return ms
  }, { n: 20, warmup: 2, sample: true, budgetMs: 150_000 }), 'p50 ≤ 60 ms')

  const sbx = await Sandbox.create(conn)
  try {
    await sbx.runCode('1')
    const cells = []
    const commands = []
    const deadline = Date.now() + 60_000
    for (let i = 0; i < 60 && Date.now() < deadline; i++) {
      let t0 = performance.now()
      await sbx.runCode('1')
      if (i >= 5) cells.push(performance.now() - t0)
      t0 = performance.now()
      await sbx.commands.run('true')
      if (i >= 5) commands.push(performance.now() - t0)
    }
    const diffs = cells.map((c, i) => c - commands[i])
    table.latency("runCode('1') round trip", cells.sort((a, b) => a - b))
    table.latency("commands.run('true') on the same sandbox", commands.sort((a, b) => a - b))
    table.latency('  runCode minus commands.run, per pair', diffs.sort((a, b) => a - b), 'p50 ≤ 10 ms')

    table.latency('a matplotlib line plot, its PNG and chart', await measure(async () => {
      const r = await sbx.runCode(plot)
      const res = r.results.find((x) => x.chart)
      if (!res || res.chart.type !== 'line' || !res.png) throw new Error(`no line chart with a PNG: ${JSON.stringify(r.error ?? r.results.map((x) => Object.keys(x)))}`)
    }, { n: 10, warmup: 2, budgetMs: 60_000 }), 'p50 ≤ 300 ms')
  } finally {
    await sbx.kill()
  }

  // Memory of idle code-interpreter sandboxes: three, a cell run in each
  // (the kernel started), then left alone.
  const idle = await Promise.all([0, 1, 2].map(() => Sandbox.create(conn)))
  try {
    for (const s of idle) await s.runCode('x = 1')
    await sleep(5_000)
    const held = []
    for (const s of idle) {
      const m = await s.getMetrics()
      if (m.length) held.push(m[m.length - 1].memUsed / 2 ** 20)
    }
    table.rows.push(['memory held by an idle code-interpreter sandbox (kernel started)', String(held.length),
      held.length ? Math.round([...held].sort((a, b) => a - b)[Math.floor(held.length / 2)]).toString() : '-',
      held.length ? Math.round(Math.max(...held)).toString() : '-', 'MiB', ''])
  } finally {
    await Promise.all(idle.map((s) => s.kill().catch(() => {})))
  }
} finally {
  table.print()
  await killAll(w).catch(() => {})
  await w.stop({ removeDataDir: true })
}
