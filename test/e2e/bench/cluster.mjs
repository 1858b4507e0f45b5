// Benchmarks a cluster on this one box through the official SDK: create →
// first command through an api process (the RPC and proxy hop to a node)
// against a `--role all` server on the same PostgreSQL (so that only the
// hop differs); 40 concurrent creates across two nodes; and a file's
// download through the api's proxy (forwarded to the node's) against the
// all role's proxy. Run by `make bench`; prints one table. Loops are
// bounded in count and time.
import { rmSync } from 'node:fs'
import { Sandbox } from 'e2b'
import { startWarren, killAll } from '../setup/start-warren.mjs'
import { psql, startCluster } from '../setup/start-cluster.mjs'
import { createToCommand, measure, Table } from './stats.mjs'

const table = new Table()
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))
const size = 64 << 20

// downloads times reading a 64 MiB file through conn's proxy (a signed
// URL, so that the proxy finds the sandbox by its signature as well).
async function downloads(conn) {
  const sbx = await Sandbox.create(conn)
  try {
    await sbx.commands.run(`head -c ${size} /dev/urandom > /tmp/big`)
    const url = await sbx.downloadUrl('/tmp/big')
    return await measure(async () => {
      const t0 = performance.now()
      const res = await fetch(url)
      let n = 0
      for await (const chunk of res.body) n += chunk.length
      if (n !== size) throw new Error(`read ${n} bytes`)
      return size / 1e6 / ((performance.now() - t0) / 1000)
    }, { n: 8, warmup: 1, sample: true, budgetMs: 60_000 })
  } finally {
    await sbx.kill()
  }
}

// burst creates n sandboxes at once and returns the wall time and where
// they ran (nodeOf); the sandboxes are killed afterwards (not timed).
async function burst(conn, n, nodeOf) {
  const t0 = performance.now()
  const sbxs = await Promise.all(Array.from({ length: n }, () => Sandbox.create(conn)))
  const ms = performance.now() - t0
  const nodes = {}
  for (const s of sbxs) nodes[nodeOf(s.sandboxId)] = (nodes[nodeOf(s.sandboxId)] ?? 0) + 1
  await Promise.all(sbxs.map((s) => s.kill()))
  return { ms, nodes }
}

// Both run at once, and the two create → first command series are
// interleaved, so that the machine's drift falls on both alike.
const db = `warren_bench_all_${process.pid}`
psql(`CREATE DATABASE ${db}`)
const w = await startWarren({ instance: 'bcall', net16: 141, poolSize: 2,
  extraArgs: ['--store', `postgres:///${db}?host=/var/run/postgresql&user=root&sslmode=disable`] })
let c
try {
  c = await startCluster({ nodes: { bna: { prefix: 'wbna', net16: 142 }, bnb: { prefix: 'wbnb', net16: 143 } }, poolSize: 2 })
  const all = { apiUrl: w.apiUrl, sandboxUrl: w.sandboxUrl, apiKey: w.apiKey }
  const viaAPI = c.apis[0].opts
  await sleep(2000)
  const allMs = []
  const apiMs = []
  const diffs = []
  const deadline = Date.now() + 300_000
  for (let i = 0; i < 62 && Date.now() < deadline; i++) {
    // Which goes first alternates, so that neither always follows a pause.
    // The pauses let each create's warm pool refill (a runsc start takes
    // this box's CPU for ~0.1-0.3 s) before the next is timed.
    const first = i % 2 === 0
    const a = first ? await createToCommand(all) : undefined
    await sleep(700)
    const b = await createToCommand(viaAPI)
    await sleep(700)
    const a2 = first ? a : await createToCommand(all)
    if (!first) await sleep(700)
    if (i >= 2) { // warm-up
      allMs.push(a2)
      apiMs.push(b)
      diffs.push(b - a2)
    }
  }
  table.latency('create → first command, role all, warm pool (PostgreSQL)', allMs.sort((x, y) => x - y))
  table.latency('create → first command, through the api role, warm pools', apiMs.sort((x, y) => x - y))
  // The pairs' differences, each taken a moment apart: the hop's cost
  // with the machine's drift cancelled (p50 is the median difference).
  table.latency('  the api role minus role all, per pair (median of differences)', diffs.sort((x, y) => x - y), 'p50 ≤ 2 ms')
  // One request and one envd RPC through each proxy, interleaved.
  const [sa, sb] = await Promise.all([Sandbox.create(all), Sandbox.create(viaAPI)])
  const hop = { health: [[], []], rpc: [[], []] }
  for (let i = 0; i < 200; i++) {
    for (const [k, s, conn] of [[0, sa, all], [1, sb, viaAPI]]) {
      let t0 = performance.now()
      const r = await fetch(`${conn.sandboxUrl}/health`, { headers: { 'E2b-Sandbox-Id': s.sandboxId, 'E2b-Sandbox-Port': '49983' } })
      await r.arrayBuffer()
      hop.health[k].push(performance.now() - t0)
      if (i % 4 === 0) {
        t0 = performance.now()
        await s.files.exists('/etc/hostname')
        hop.rpc[k].push(performance.now() - t0)
      }
    }
  }
  await Promise.all([sa.kill(), sb.kill()])
  table.latency("envd's /health through the proxy, role all", hop.health[0].sort((x, y) => x - y))
  table.latency("envd's /health through the api role's proxy", hop.health[1].sort((x, y) => x - y))
  table.latency('files.exists (an envd RPC), role all', hop.rpc[0].sort((x, y) => x - y))
  table.latency("files.exists (an envd RPC), through the api role's proxy", hop.rpc[1].sort((x, y) => x - y))
  const allDown = await downloads(all)
  const clusterDown = await downloads(viaAPI)
  await killAll(w).catch(() => {})
  await w.stop()

  const walls = []
  const spread = {}
  for (let i = 0; i < 3; i++) {
    const { ms, nodes } = await burst(viaAPI, 40, c.nodeOf)
    walls.push(ms)
    if (i === 0) Object.assign(spread, nodes)
    await sleep(3000)
  }
  table.latency(`40 concurrent creates across 2 nodes, wall (first burst: ${Object.entries(spread).map(([n, k]) => `${n} ${k}`).join(', ')})`, walls.sort((a, b) => a - b))
  table.throughput('64 MiB download through the proxy, role all', allDown)
  table.throughput('64 MiB download through the api role (forwarded to the node)', clusterDown)
} finally {
  await killAll(w).catch(() => {})
  await w.stop()
  rmSync(w.dataDir, { recursive: true, force: true })
  psql(`DROP DATABASE IF EXISTS ${db} WITH (FORCE)`)
  await c?.stop()
}
table.print()
