// Benchmarks pause/resume, snapshots and fork through the official SDK
// against a real `warren serve` (runsc): pause and resume with 50 and 500
// MiB resident, a snapshot, forks of 1 and 10 (until every child answers
// a command), and the memory a pause frees, read from the sandbox's
// cgroup on this host. Each resume is also broken into the steps the
// server timed (its debug log line "sandbox resumed … steps=…"). Run by
// `make bench`; prints one table. Loops are bounded in count and time.
// LIFECYCLE_QUICK=1 measures only pause and resume at 50 MiB.
import { readFileSync, rmSync } from 'node:fs'
import { Sandbox, Template } from 'e2b'
import { startWarren, killAll } from '../setup/start-warren.mjs'
import { measure, percentile, Table } from './stats.mjs'

const table = new Table()
const instance = 'blc'

const quick = process.env.LIFECYCLE_QUICK === '1'
const w = await startWarren({ instance, net16: 134, poolSize: 0, extraArgs: ['--log-level', 'debug'] })
const conn = { apiUrl: w.apiUrl, sandboxUrl: w.sandboxUrl, apiKey: w.apiKey }

function cgroupMiB(id) {
  const p = `/sys/fs/cgroup/memory/warren-${instance}/${id}/memory.usage_in_bytes`
  try {
    return Number(readFileSync(p, 'utf8')) / 1048576
  } catch {
    return null // gone, or going (ENODEV while it is removed)
  }
}

// resumeSteps is the server's step traces of resumes (debug log lines
// "sandbox resumed sandbox=… steps=name=ms,…"), in order.
function resumeSteps(output) {
  const re = /msg="sandbox resumed" sandbox=\S+ steps="?([^"\s]+)/
  const out = []
  for (const line of output.split('\n')) {
    const m = re.exec(line)
    if (m) out.push(Object.fromEntries(m[1].split(',').map((kv) => kv.split('=')).map(([k, v]) => [k, Number(v)])))
  }
  return out
}

// stepRows adds a row per step (first-seen order) and their sum.
function stepRows(label, traces) {
  const names = []
  for (const t of traces) for (const k of Object.keys(t)) if (!names.includes(k)) names.push(k)
  const sorted = (xs) => xs.filter((x) => x !== undefined).sort((a, b) => a - b)
  for (const k of names) table.latency(`  ${label}: ${k}`, sorted(traces.map((t) => t[k])))
  table.latency(`  ${label}: server total`, sorted(traces.map((t) => Object.values(t).reduce((a, b) => a + b, 0))))
}

// ballast makes a process of the sandbox hold mib MiB, every page written.
async function ballast(sbx, mib) {
  await sbx.commands.run(`nohup python3 -c '
import time
n = ${mib} << 20
b = bytearray(n)
b[::4096] = b"\\x01" * ((n + 4095) // 4096)
open("/tmp/ready", "w").close()
time.sleep(86400)' >/dev/null 2>&1 &
for i in $(seq 300); do [ -e /tmp/ready ] && break; sleep 0.1; done`, { timeoutMs: 60_000 })
}

try {
  // The base template's sandboxes have 512 MB: 500 MiB resident needs a
  // template of 1 GiB.
  if (!quick) await Template.build(Template().fromTemplate('base').runCmd('true'), 'bench-1g', { ...conn, cpuCount: 2, memoryMB: 1024 })
  for (const mib of quick ? [50] : [50, 500]) {
    const sbx = await Sandbox.create(mib === 50 ? 'base' : 'bench-1g', { ...conn, timeoutMs: 600_000 })
    await ballast(sbx, mib)
    const pauses = []
    const resumes = []
    const freed = []
    const n = mib === 50 ? 20 : 8
    const tracesBefore = resumeSteps(w.output()).length
    for (let i = 0; i < n + 1; i++) {
      const charged = cgroupMiB(sbx.sandboxId)
      let t0 = performance.now()
      if (!(await sbx.pause())) throw new Error('pause returned false')
      const pauseMs = performance.now() - t0
      // The pause answers once the sandbox is stopped; its cgroup goes
      // with its container right after.
      const gone = Date.now() + 3_000
      while (cgroupMiB(sbx.sandboxId) !== null && Date.now() < gone) await new Promise((r) => setTimeout(r, 10))
      if (cgroupMiB(sbx.sandboxId) === null && charged !== null) freed.push(charged)
      await new Promise((r) => setTimeout(r, 200))
      t0 = performance.now()
      await sbx.connect()
      const resumeMs = performance.now() - t0
      if (i > 0) { // the first round warms caches
        pauses.push(pauseMs)
        resumes.push(resumeMs)
      }
    }
    pauses.sort((a, b) => a - b)
    resumes.sort((a, b) => a - b)
    table.latency(`pause (${mib} MiB resident)`, pauses, mib === 50 ? 'p50 ≤ 150 ms' : '')
    table.latency(`resume via connect (${mib} MiB resident)`, resumes, mib === 50 ? 'p50 ≤ 200 ms' : '')
    stepRows(`server steps of a resume (${mib} MiB)`, resumeSteps(w.output()).slice(tracesBefore + 1)) // the first round warms caches
    freed.sort((a, b) => a - b)
    table.rows.push([`memory freed by a pause (${mib} MiB resident, cgroup)`, String(freed.length), percentile(freed, 50).toFixed(0), percentile(freed, 99).toFixed(0), 'MiB', ''])
    await sbx.kill()
  }

  if (!quick) await snapshotsAndForks()
} finally {
  await killAll(w).catch(() => {})
  await w.stop()
  const problems = w.output().split('\n').filter((l) => /level=(WARN|ERROR)/.test(l))
  if (problems.length) console.error(problems.join('\n'))
  rmSync(w.dataDir, { recursive: true, force: true })
}
table.print()

// snapshotsAndForks times createSnapshot and forks of 1 and 10 of a sandbox
// holding 50 MiB.
async function snapshotsAndForks() {
  const src = await Sandbox.create({ ...conn, timeoutMs: 600_000 })
  await ballast(src, 50)
  const snaps = await measure(async () => {
    const t0 = performance.now()
    const s = await src.createSnapshot()
    const ms = performance.now() - t0
    await Sandbox.deleteSnapshot(s.snapshotId, conn)
    return ms
  }, { n: 10, warmup: 1, sample: true, budgetMs: 120_000 })
  table.latency('createSnapshot (50 MiB resident)', snaps)

  for (const count of [1, 10]) {
    const forks = await measure(async () => {
      const t0 = performance.now()
      const children = await src.fork({ count, timeoutMs: 120_000 })
      await Promise.all(children.map(async (c) => {
        if (!(c instanceof Sandbox)) throw c
        const r = await c.commands.run('echo ok')
        if (r.stdout !== 'ok\n') throw new Error(`child answered ${r.stdout}`)
      }))
      const ms = performance.now() - t0
      await Promise.all(children.map((c) => c.kill()))
      return ms
    }, { n: count === 1 ? 10 : 5, warmup: 1, sample: true, budgetMs: 180_000 })
    table.latency(`fork of ${count} until all answer a command (50 MiB)`, forks, count === 10 ? 'p50 ≤ 1.5 s' : '')
  }
}
