// Benchmarks the platform through the official SDK against real `warren
// serve` instances: create → first command (sequential, with and without
// a warm pool), 20 concurrent creates, and listing with 1000 sandboxes in
// the store. Run by `make bench`; prints one table. Loops are bounded in
// count and time.
import { execFileSync } from 'node:child_process'
import { rmSync } from 'node:fs'
import path from 'node:path'
import { Sandbox } from 'e2b'
import { startWarren, killAll } from '../setup/start-warren.mjs'
import { createToCommand, measure, percentile, Table } from './stats.mjs'

const table = new Table()
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

async function withWarren(opts, fn) {
  const w = await startWarren({ instance: 'bench', net16: 129, ...opts })
  const conn = { apiUrl: w.apiUrl, sandboxUrl: w.sandboxUrl, apiKey: w.apiKey }
  try {
    await fn(w, conn)
  } finally {
    await killAll(w).catch(() => {})
    await w.stop()
    const problems = w.output().split('\n').filter((l) => /level=(WARN|ERROR)/.test(l))
    if (problems.length) console.error(problems.join('\n'))
    try {
      rmSync(w.dataDir, { recursive: true })
    } catch (e) {
      console.error(`warren left something in ${w.dataDir}: ${e.message}`)
    }
  }
}

// Warm: the pool refills in the background; the pause between runs lets
// it (a runsc start takes ~0.2 s), so each create claims a warm sandbox.
await withWarren({ poolSize: 2 }, async (w, conn) => {
  await sleep(2000)
  table.latency('create → first command, warm pool (runsc)',
    await measure(async () => { const ms = await createToCommand(conn); await sleep(600); return ms }, { n: 30, warmup: 2, sample: true, budgetMs: 120_000 }),
    'p50 ≤ 25 ms')
})

await withWarren({ poolSize: 2, extraArgs: ['--runtime', 'runc', '--insecure-runtime'] }, async (w, conn) => {
  await sleep(2000)
  table.latency('create → first command, warm pool (runc)',
    await measure(async () => { const ms = await createToCommand(conn); await sleep(300); return ms }, { n: 30, warmup: 2, sample: true, budgetMs: 120_000 }),
    'p50 ≤ 25 ms')
})

await withWarren({ poolSize: 0 }, async (w, conn) => {
  table.latency('create → first command, cold (runsc)',
    await measure(() => createToCommand(conn), { n: 30, warmup: 2, sample: true, budgetMs: 120_000 }), 'p50 ≤ 150 ms')

  const walls = []
  for (let round = 0; round < 3; round++) {
    const t0 = performance.now()
    const sbxs = await Promise.all(Array.from({ length: 20 }, () => Sandbox.create(conn)))
    walls.push(performance.now() - t0)
    await Promise.all(sbxs.map((s) => s.kill()))
  }
  table.latency('20 concurrent creates, wall, cold (runsc)', walls.sort((a, b) => a - b), '≤ 500 ms')
})

await withWarren({ poolSize: 20, extraArgs: ['--max-sandboxes', '40'] }, async (w, conn) => {
  const walls = []
  for (let round = 0; round < 3; round++) {
    // Let the pool fill to 20 (bounded wait).
    await sleep(round === 0 ? 8000 : 6000)
    const t0 = performance.now()
    const sbxs = await Promise.all(Array.from({ length: 20 }, () => Sandbox.create(conn)))
    walls.push(performance.now() - t0)
    await Promise.all(sbxs.map((s) => s.kill()))
  }
  table.latency('20 concurrent creates, wall, warm pool of 20', walls.sort((a, b) => a - b), '≤ 500 ms')
})

await withWarren({ poolSize: 0 }, async (w, conn) => {
  const repo = path.resolve(path.dirname(new URL(import.meta.url).pathname), '../../..')
  execFileSync('go', ['run', './test/e2e/bench/seedstore', '-store', path.join(w.dataDir, 'warren.db'), '-n', '1000'], { cwd: repo, stdio: 'inherit' })
  table.latency('Sandbox.list first page (100 of 1000)', await measure(() => Sandbox.list(conn).nextItems(), { n: 100, warmup: 5 }))
  table.latency('Sandbox.list with a metadata filter (1 of 1000)',
    await measure(() => Sandbox.list({ ...conn, query: { metadata: { i: '500' } } }).nextItems(), { n: 100, warmup: 5 }))
  table.latency('Sandbox.list all 10 pages of 1000', await measure(async () => {
    const p = Sandbox.list(conn)
    let n = 0
    while (p.hasNext) n += (await p.nextItems()).length
    if (n !== 1000) throw new Error(`listed ${n}`)
  }, { n: 20, warmup: 2 }))
})

table.print()
