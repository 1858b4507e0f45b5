// Benchmarks template builds and the sandboxes they start, through the
// official SDK against its own real `warren serve` (pool 0, so that every
// create is cold or restored from a snapshot, never warm): a 3-step build
// with nothing cached, a rebuild with every step cached, and create →
// first command for a template with a start command (restored snapshot)
// against the same steps without one (cold boot, then start the server
// and wait for its port). Run by `make bench`; prints one table. Loops are
// bounded in count and time; every sandbox and the data dir go at the end.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { Sandbox, Template, waitForPort } from 'e2b'
import { startWarren, killAll } from '../setup/start-warren.mjs'
import { percentile, withTimeout } from './stats.mjs'

const rows = []
const made = []
const stamp = Date.now().toString(36)
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

// row adds a latency row: samples in ms, printed with one decimal.
function row(metric, samples, note = '') {
  const s = [...samples].sort((a, b) => a - b)
  const f = (v) => (Number.isNaN(v) ? '-' : v.toFixed(1))
  rows.push([metric, String(s.length), f(percentile(s, 50)), f(percentile(s, 99)), note])
}

function printTable() {
  const head = ['metric', 'n', 'p50 (ms)', 'p99 (ms)', 'note']
  const all = [head, ...rows]
  const w = head.map((_, i) => Math.max(...all.map((r) => r[i].length)))
  const line = (r) => '| ' + r.map((c, i) => c.padEnd(w[i])).join(' | ') + ' |'
  console.log(line(head))
  console.log('|' + w.map((x) => '-'.repeat(x + 2)).join('|') + '|')
  for (const r of rows) console.log(line(r))
}


// loop runs fn up to n times before the deadline and returns its samples.
async function loop(n, budgetMs, fn) {
  const deadline = Date.now() + budgetMs
  const out = []
  for (let i = 0; i < n && Date.now() < deadline; i++) out.push(await fn(i))
  return out
}

async function create(name) {
  const sbx = await withTimeout(Sandbox.create(name), 60_000, `Sandbox.create(${name})`)
  made.push(sbx.sandboxId)
  return sbx
}

async function kill(sbx) {
  await sbx.kill()
  const i = made.indexOf(sbx.sandboxId)
  if (i >= 0) made.splice(i, 1)
}

// build times Template.build to its return; cached counts the steps the
// build log reports as cached (a check that the row measures what it says).
async function build(tpl, name) {
  const logs = []
  const t0 = performance.now()
  const info = await withTimeout(Template.build(tpl, name, { cpuCount: 1, memoryMB: 512, onBuildLogs: (e) => logs.push(e) }), 300_000, `Template.build(${name})`)
  const ms = performance.now() - t0
  return { info, ms, cached: logs.filter((e) => e.message.includes('cached')).length }
}

const ctxDir = mkdtempSync(path.join(os.tmpdir(), 'warren-bench-tpl-'))
writeFileSync(path.join(ctxDir, 'server.py'), [
  'import http.server, socketserver',
  'class H(http.server.BaseHTTPRequestHandler):',
  '    def do_GET(self):',
  '        self.send_response(200); self.end_headers(); self.wfile.write(b"hello from server.py")',
  'socketserver.TCPServer(("0.0.0.0", 8000), H).serve_forever()',
].join('\n'))

const serverCmd = 'python3 /home/user/app/server.py'

// steps: the 3-step template (RUN, COPY, RUN) every row uses.
function steps({ skipCache = false } = {}) {
  let t = Template({ fileContextPath: ctxDir })
  if (skipCache) t = t.skipCache()
  return t
    .fromTemplate('base')
    .runCmd('echo step one > /tmp/one.txt')
    .copy('server.py', '/home/user/app/')
    .runCmd('python3 -m py_compile /home/user/app/server.py && echo step three > /tmp/three.txt')
}

const w = await startWarren({ instance: 'tbn', net16: 131, poolSize: 0 })
process.env.E2B_API_URL = w.apiUrl
process.env.E2B_SANDBOX_URL = w.sandboxUrl
process.env.E2B_API_KEY = w.apiKey
process.env.E2B_DOMAIN = 'localhost'
delete process.env.E2B_DEBUG

let failed = null
try {
  // 1. Nothing cached: every build runs its steps again.
  let cachedSeen = 0
  const nocache = await loop(5, 600_000, async (i) => {
    const b = await build(steps({ skipCache: true }), `bench-nocache-${stamp}-${i}`)
    cachedSeen += b.cached
    return b.ms
  })
  row('build of a 3-step template (RUN, COPY, RUN), nothing cached', nocache,
    cachedSeen ? `skipCache; ${cachedSeen} log lines said cached` : 'skipCache; no step cached')

  // 2. Every step cached: fill the cache once, then time rebuilds.
  const stepsName = `bench-steps-${stamp}`
  await build(steps(), stepsName)
  let minCached = Infinity
  const cached = await loop(10, 300_000, async () => {
    const b = await build(steps(), stepsName)
    minCached = Math.min(minCached, b.cached)
    return b.ms
  })
  row('rebuild with nothing changed (every step cached)', cached, `≥ ${minCached} cached log lines per build`)

  // 3. A start command: sandboxes are restored from the build's snapshot.
  const startName = `bench-start-${stamp}`
  const startBuild = await build(steps().setStartCmd(serverCmd, waitForPort(8000)), startName)
  let checked = false
  const restored = await loop(20, 300_000, async () => {
    const t0 = performance.now()
    const sbx = await create(startName)
    await sbx.commands.run('true')
    const ms = performance.now() - t0
    if (!checked) {
      const r = await sbx.commands.run('curl -s localhost:8000')
      if (r.stdout.trim() !== 'hello from server.py') throw new Error(`the start command's server did not answer right after create: ${JSON.stringify(r.stdout)}`)
      checked = true
    }
    await kill(sbx)
    return ms
  })
  row('create → first command, template with a start command (restored snapshot)', restored,
    `server answers on :8000 right after create (checked); build ${startBuild.ms.toFixed(0)} ms`)

  // 4. The same steps without a start command: a cold boot.
  const cold = await loop(20, 300_000, async () => {
    const t0 = performance.now()
    const sbx = await create(stepsName)
    await sbx.commands.run('true')
    const ms = performance.now() - t0
    await kill(sbx)
    return ms
  })
  row('create → first command, same template without a start command (cold)', cold, 'pool 0')

  const coldServer = await loop(20, 300_000, async () => {
    const t0 = performance.now()
    const sbx = await create(stepsName)
    await sbx.commands.run(serverCmd, { background: true })
    const deadline = Date.now() + 15_000
    for (;;) {
      const r = await sbx.commands.run('ss -Htln sport = :8000')
      if (r.stdout.trim() !== '') break
      if (Date.now() > deadline) throw new Error('server.py did not listen on :8000 within 15 s')
      await sleep(5)
    }
    const ms = performance.now() - t0
    await kill(sbx)
    return ms
  })
  row('create → first command, same template without a start command (cold boot), then start the server and wait for the port', coldServer,
    'background python3 server.py, poll ss until :8000 listens')
} catch (e) {
  failed = e
} finally {
  for (const id of made) await Sandbox.kill(id).catch(() => {})
  await killAll(w).catch(() => {})
  const problems = w.output().split('\n').filter((l) => /level=(WARN|ERROR)/.test(l))
  await w.stop({ removeDataDir: true })
  rmSync(ctxDir, { recursive: true, force: true })
  if (problems.length) console.error(problems.join('\n'))
}

printTable()
if (failed) {
  console.error(failed)
  process.exitCode = 1
}
