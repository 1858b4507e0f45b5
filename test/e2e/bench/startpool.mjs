// Benchmarks create → first command for a template with a start command
// (its sandboxes restored from the build's snapshot, the server running),
// restored cold against claimed from a warm pool of restored sandboxes,
// through the official SDK against real `warren serve` runs (runsc): one
// with --pool-size 0 (every create restores), then one with --pool-size 1
// (the template's pool restores ahead of demand; the creates are paced so
// that it refills between them, and each sample is classed warm or cold
// by the server's debug log, so that a cold one never counts as warm).
// Run by `make bench`; prints one table. Loops are bounded in count and
// time; every sandbox and data dir go at the end.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { Sandbox, Template, waitForPort } from 'e2b'
import { startWarren, killAll } from '../setup/start-warren.mjs'
import { Table, withTimeout } from './stats.mjs'

const N = Number(process.env.STARTPOOL_N || 30)
const table = new Table()
const stamp = Date.now().toString(36)
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))


const ctxDir = mkdtempSync(path.join(os.tmpdir(), 'warren-bench-startpool-'))
writeFileSync(path.join(ctxDir, 'server.py'), [
  'import http.server, socketserver',
  'class H(http.server.BaseHTTPRequestHandler):',
  '    def do_GET(self):',
  '        self.send_response(200); self.end_headers(); self.wfile.write(b"hello from server.py")',
  'socketserver.TCPServer(("0.0.0.0", 8000), H).serve_forever()',
].join('\n'))

const template = () => Template({ fileContextPath: ctxDir })
  .fromTemplate('base')
  .copy('server.py', '/home/user/app/')
  .setStartCmd('python3 /home/user/app/server.py', waitForPort(8000))

// created maps the sandboxes the server's debug log says were created to
// whether a warm one was claimed.
function created(output) {
  const out = new Map()
  for (const m of output.matchAll(/msg="sandbox created" sandbox=(\S+) warm=(true|false)/g)) out.set(m[1], m[2] === 'true')
  return out
}

// warmReady counts the pool's restores of a start snapshot so far.
const warmReady = (output) => (output.match(/msg="warm sandbox ready" .*snapshot=snap-/g) || []).length

// run starts a server with poolSize, builds the template, and times n
// creates → first command; before each one, with a pool, it waits (up to
// 10 s) for the pool to have restored one more sandbox than it had.
async function run(poolSize, n) {
  const w = await startWarren({ instance: 'bspl', net16: 146, poolSize, extraArgs: ['--log-level', 'debug'] })
  process.env.E2B_API_URL = w.apiUrl
  process.env.E2B_SANDBOX_URL = w.sandboxUrl
  process.env.E2B_API_KEY = w.apiKey
  process.env.E2B_DOMAIN = 'localhost'
  delete process.env.E2B_DEBUG
  const made = []
  const samples = []
  try {
    const name = `bench-startpool-${stamp}-${poolSize}`
    await withTimeout(Template.build(template(), name, { cpuCount: 1, memoryMB: 512 }), 300_000, `Template.build(${name})`)
    const deadline = Date.now() + 240_000
    let ready = 0
    for (let i = 0; i <= n && Date.now() < deadline; i++) {
      if (poolSize > 0 && i > 0) {
        for (const until = Date.now() + 10_000; warmReady(w.output()) <= ready && Date.now() < until;) await sleep(20)
        ready = warmReady(w.output())
        await sleep(100) // its warm-up and memory sample, after the log line
      }
      const t0 = performance.now()
      const sbx = await withTimeout(Sandbox.create(name), 60_000, `Sandbox.create(${name})`)
      made.push(sbx.sandboxId)
      await sbx.commands.run('true')
      const ms = performance.now() - t0
      if (i === 1) { // the start command's server answers at once
        const r = await sbx.commands.run('curl -s localhost:8000')
        if (r.stdout.trim() !== 'hello from server.py') throw new Error(`the start command's server did not answer right after create: ${JSON.stringify(r.stdout)}`)
      }
      await sbx.kill()
      made.pop()
      // The first create makes the pool (and is cold): not a sample.
      if (i > 0) samples.push({ id: sbx.sandboxId, ms })
    }
    await sleep(200)
    const log = created(w.output())
    return samples.map((s) => ({ ...s, warm: log.get(s.id) }))
  } finally {
    for (const id of made) await Sandbox.kill(id).catch(() => {})
    await killAll(w).catch(() => {})
    const problems = w.output().split('\n').filter((l) => /level=(WARN|ERROR)/.test(l))
    await w.stop({ removeDataDir: true })
    if (problems.length) console.error(problems.join('\n'))
  }
}

let failed = null
try {
  const cold = await run(0, N)
  if (cold.some((s) => s.warm !== false)) throw new Error('a create with --pool-size 0 was not logged as cold')
  table.latency('create → first command, start-command template, restored cold', cold.map((s) => s.ms), '--pool-size 0; server on :8000 answers (checked)')
  const pooled = await run(1, N)
  const warm = pooled.filter((s) => s.warm === true)
  table.latency('create → first command, start-command template, warm (restored ahead)', warm.map((s) => s.ms),
    `--pool-size 1, paced for the refill; ${warm.length} of ${pooled.length} claimed warm`)
  const missed = pooled.filter((s) => s.warm !== true)
  if (missed.length) table.latency('  of which the pool was empty (restored cold)', missed.map((s) => s.ms), '')
} catch (e) {
  failed = e
} finally {
  rmSync(ctxDir, { recursive: true, force: true })
}

table.print()
if (failed) {
  console.error(failed)
  process.exitCode = 1
}
