// Density (issue 16): starts idle sandboxes on a real `warren serve`
// (runsc, pool 0) until DENSITY_MAX (default 1000) are running, a create
// fails (the node is full), the host has less than DENSITY_FLOOR_MIB
// (default 2048) of MemAvailable left, or DENSITY_BUDGET_S (default 600)
// pass, then
// reports the host memory each idle sandbox costs, the server's own
// memory, and create latency at that density next to the latency of the
// first creates. Run by `make bench`; bounded in count and time.
//
// Memory per sandbox is read from the host, page cache excluded:
//   - PSS of the sandbox's host processes (runsc's sandbox, i.e. the
//     sentry with envd and the guest's memory inside it, its gofer and
//     systrap stubs): the anonymous and shared-memory parts (the guest's
//     memory file is shared memory), and the file-backed part apart (the
//     runsc binary's pages, shared by all and counted proportionally);
//   - the sandboxes' cgroups: their memory.stat without page cache;
//   - the drop of the host's MemAvailable.
import { existsSync, readFileSync, readdirSync } from 'node:fs'
import { Sandbox } from 'e2b'
import { startWarren, killAll } from '../setup/start-warren.mjs'
import { Table } from './stats.mjs'

const MAX = Number(process.env.DENSITY_MAX || 1000)
const BUDGET_MS = Number(process.env.DENSITY_BUDGET_S || 600) * 1000
const FLOOR = Number(process.env.DENSITY_FLOOR_MIB || 2048) * 1024 * 1024
const PROBES = 10 // creates timed at low density and at the end
const instance = 'bdens'
const runDir = `/run/warren-${instance}`
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))
const MiB = 1024 * 1024

function meminfo(key) {
  const m = new RegExp(`^${key}:\\s+(\\d+) kB`, 'm').exec(readFileSync('/proc/meminfo', 'utf8'))
  return Number(m[1]) * 1024
}

// smaps reads a process's smaps_rollup (bytes), or null if it is gone.
function smaps(pid) {
  try {
    const out = {}
    for (const m of readFileSync(`/proc/${pid}/smaps_rollup`, 'utf8').matchAll(/^(\w+):\s+(\d+) kB/gm)) out[m[1]] = Number(m[2]) * 1024
    return out
  } catch {
    return null
  }
}

// runscProcesses are the host processes of this server's sandboxes: every
// runsc process (sandbox, gofer) whose command line names its run dir,
// and their descendants (systrap stubs).
function runscProcesses() {
  const parent = new Map()
  const ours = new Set()
  for (const d of readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue
    try {
      const stat = readFileSync(`/proc/${d}/stat`, 'utf8')
      parent.set(d, stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1])
      const cmd = readFileSync(`/proc/${d}/cmdline`, 'utf8')
      if (cmd.includes('runsc') && cmd.includes(runDir + '/')) ours.add(d)
    } catch {}
  }
  const isOurs = (pid) => {
    for (let p = pid, i = 0; p && p !== '0' && i < 64; p = parent.get(p), i++) if (ours.has(p)) return true
    return false
  }
  return [...parent.keys()].filter(isOurs)
}

function sumSmaps(pids) {
  const t = { Rss: 0, Pss: 0, Pss_Anon: 0, Pss_Shmem: 0, Pss_File: 0 }
  for (const pid of pids) {
    const s = smaps(pid)
    if (s) for (const k of Object.keys(t)) t[k] += s[k] || 0
  }
  return t
}

// cgroupMemory is the memory of the server's cgroup parent (its
// sandboxes' cgroups) without page cache: anon + shmem + kernel of
// memory.stat on cgroup v2, total_rss + total_shmem on v1 (whose
// total_cache, the page cache, includes shmem).
function cgroupMemory() {
  const read = (f) => Object.fromEntries(readFileSync(f, 'utf8').trim().split('\n').map((l) => l.split(' ')).map(([k, v]) => [k, Number(v)]))
  const v2 = `/sys/fs/cgroup/warren-${instance}/memory.stat`
  const v1 = `/sys/fs/cgroup/memory/warren-${instance}/memory.stat`
  if (existsSync(v2)) {
    const st = read(v2)
    return { nonFile: (st.anon || 0) + (st.shmem || 0) + (st.kernel || 0), file: st.file || 0 }
  }
  if (existsSync(v1)) {
    const st = read(v1)
    return { nonFile: (st.total_rss || 0) + (st.total_shmem || 0), file: (st.total_cache || 0) - (st.total_shmem || 0) }
  }
  return null
}

async function timedCreate(conn) {
  const t0 = performance.now()
  const sbx = await Sandbox.create({ ...conn, timeoutMs: 3600_000 })
  await sbx.commands.run('true')
  return { sbx, ms: performance.now() - t0 }
}

const w = await startWarren({
  instance, net16: 136, poolSize: 0,
  // Admission is not what this measures: the node's CPU and memory
  // overcommit would stop it at 32 sandboxes of 2 CPUs on 2 cores.
  extraArgs: ['--max-sandboxes', String(MAX + 2), '--cpu-overcommit', '10000', '--memory-overcommit', '100'],
})
const conn = { apiUrl: w.apiUrl, sandboxUrl: w.sandboxUrl, apiKey: w.apiKey }
const table = new Table()
const sorted = (xs) => [...xs].sort((a, b) => a - b)
const mib = (b) => (b / MiB).toFixed(1)
const sbxs = []
try {
  await sleep(1000)
  const availBefore = meminfo('MemAvailable')
  const nodeBefore = smaps(w.pid)
  const deadline = Date.now() + BUDGET_MS
  const first = []
  let stopped = `reached DENSITY_MAX=${MAX}`
  while (sbxs.length < MAX) {
    if (Date.now() > deadline) { stopped = `time budget of ${BUDGET_MS / 1000} s`; break }
    if (meminfo('MemAvailable') < FLOOR) { stopped = `the host's MemAvailable fell below ${FLOOR / MiB} MiB`; break }
    try {
      const { sbx, ms } = await timedCreate(conn)
      sbxs.push(sbx)
      if (first.length < PROBES) first.push(ms)
    } catch (e) {
      stopped = `create failed: ${e.message}`
      break
    }
  }
  await sleep(5000) // idle: let the sentries settle
  const n = sbxs.length
  const procs = runscProcesses()
  const pss = sumSmaps(procs)
  const cg = cgroupMemory()
  const availAfter = meminfo('MemAvailable')
  const nodeAfter = smaps(w.pid)
  // Latency at density: create → first command → kill, one at a time, so
  // the count stays at n (the server allows n + 2).
  const atDensity = []
  for (let i = 0; i < PROBES && Date.now() < deadline + 60_000; i++) {
    const { sbx, ms } = await timedCreate(conn)
    atDensity.push(ms)
    await sbx.kill()
  }
  console.error(`density: ${n} idle sandboxes (${stopped}); ${procs.length} runsc host processes`)
  const row = (metric, value, unit) => table.rows.push([metric, String(n), value, '', unit, ''])
  row('idle sandboxes held', String(n), 'count')
  row('PSS per idle sandbox, anon + shmem (runsc sandbox, gofer, stubs)', mib((pss.Pss_Anon + pss.Pss_Shmem) / n), 'MiB')
  row('PSS per idle sandbox, file-backed (runsc binary, shared)', mib(pss.Pss_File / n), 'MiB')
  row('RSS per idle sandbox (shared pages counted in each)', mib(pss.Rss / n), 'MiB')
  if (cg) row('cgroups per idle sandbox, without page cache', mib(cg.nonFile / n), 'MiB')
  if (cg) row('cgroups page cache per idle sandbox (not counted above)', mib(cg.file / n), 'MiB')
  row('host MemAvailable drop per idle sandbox', mib((availBefore - availAfter) / n), 'MiB')
  if (nodeBefore && nodeAfter) {
    row('warren serve RSS, before → at density', `${mib(nodeBefore.Rss)} → ${mib(nodeAfter.Rss)}`, 'MiB')
  }
  table.latency('create → first command, first creates (pool 0)', sorted(first))
  table.latency(`create → first command, at ${n} idle (pool 0)`, sorted(atDensity))
} finally {
  for (let i = 0; i < sbxs.length; i += 10) await Promise.all(sbxs.slice(i, i + 10).map((s) => s.kill().catch(() => {})))
  await killAll(w).catch(() => {})
  await w.stop({ removeDataDir: true })
  const problems = w.output().split('\n').filter((l) => /level=(WARN|ERROR)/.test(l))
  if (problems.length) console.error(problems.join('\n'))
}
table.print()
