// Benchmarks envd through the official SDK (debug mode: localhost:49983).
// Run by `make bench`; prints one table. Every loop is bounded in count and
// time (see measure). "baseline" rows take the SDK or envd out of the path
// (the shell alone, a bare HTTP round trip, an upload by plain fetch), so the
// distance to them shows whose cost a number is.
import { randomBytes } from 'node:crypto'
import { spawn, execFileSync } from 'node:child_process'
import { Sandbox } from 'e2b'
import { startEnvd } from '../setup/start-envd.mjs'
import { measure, Table } from './stats.mjs'

process.env.E2B_DEBUG = 'true'
const MB = 1e6
const uid = Number(execFileSync('id', ['-u', 'user']).toString().trim())
const gid = Number(execFileSync('id', ['-g', 'user']).toString().trim())
const envd = await startEnvd()
const dir = `/tmp/warren-bench-${process.pid}`
try {
  const sbx = await Sandbox.create()
  const table = new Table()
  await sbx.files.makeDir(dir)
  try {
    await run(sbx, table)
  } finally {
    await sbx.files.remove(dir)
  }
  table.print()
} finally {
  await envd.stop()
}

// run adds one row per metric; later rows (sandbox create etc.) go here too.
async function run(sbx, table) {
  table.latency('commands.run("true") round trip', await measure(() => sbx.commands.run('true'), { n: 200 }), 'p50 ≤ 3 ms')
  table.latency('  baseline: bash -l -c true, no envd', await measure(bashAsUser, { n: 200 }))
  table.latency('  baseline: GET /health', await measure(health, { n: 200 }))
  table.latency('Start → first stdout byte', await measure(() => firstByte(sbx), { n: 100, sample: true }))

  const mib = bytes(1 << 20)
  table.latency('files.write 1 MiB', await measure(() => sbx.files.write(`${dir}/1m`, mib), { n: 50 }))
  table.latency('files.read 1 MiB', await measure(() => sbx.files.read(`${dir}/1m`, { format: 'bytes' }), { n: 50 }))

  const big = bytes(50 << 20)
  const mbps = (ms) => big.byteLength / MB / (ms / 1000)
  const bigRun = (fn) => measure(fn, { n: 5, warmup: 1 }).then((xs) => xs.map(mbps))
  table.throughput('files.write 50 MiB', await bigRun(() => sbx.files.write(`${dir}/50m`, big)), '≥ 300 MB/s')
  table.throughput('files.write 50 MiB, useOctetStream', await bigRun(() => sbx.files.write(`${dir}/50m`, big, { useOctetStream: true })))
  table.throughput('  baseline: Node fetch POST /files', await bigRun(() => post(`${dir}/50m`, big)))
  table.throughput('files.read 50 MiB', await bigRun(() => sbx.files.read(`${dir}/50m`, { format: 'bytes' })))
}

function bytes(n) {
  const b = randomBytes(n)
  return b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength)
}

// firstByte returns the time from calling commands.run until the first
// onStdout callback (measure's sample mode takes the returned value).
async function firstByte(sbx) {
  const t0 = performance.now()
  let first = 0
  await sbx.commands.run('echo x', { onStdout: () => { first ||= performance.now() } })
  if (!first) throw new Error('echo x produced no stdout callback')
  return first - t0
}

// The shell commands.run starts, spawned here directly as the same user.
function bashAsUser() {
  return new Promise((resolve, reject) => {
    const p = spawn('/bin/bash', ['-l', '-c', 'true'], {
      uid, gid, cwd: '/home/user', stdio: 'ignore',
      env: { HOME: '/home/user', USER: 'user', PATH: '/usr/local/bin:/usr/bin:/bin' },
    })
    p.on('error', reject)
    p.on('exit', resolve)
  })
}

async function health() {
  const r = await fetch('http://127.0.0.1:49983/health')
  if (r.status !== 204) throw new Error(`health: ${r.status}`)
}

async function post(path, body) {
  const r = await fetch(`http://127.0.0.1:49983/files?path=${encodeURIComponent(path)}`, {
    method: 'POST', headers: { 'content-type': 'application/octet-stream' }, body,
  })
  if (r.status !== 200) throw new Error(`upload: ${r.status}`)
  await r.arrayBuffer()
}
