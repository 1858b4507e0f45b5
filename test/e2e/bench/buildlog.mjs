// Measures what a build whose step floods its output costs the server:
// the build-log rows it keeps and the warren process's peak RSS, for a
// template whose step is `RUN timeout 60 yes`, built through the official
// SDK against its own real `warren serve`.
//
//   node bench/buildlog.mjs            # bin/warren of this tree
//   WARREN_BINARY=/path/to/warren node bench/buildlog.mjs
//   BUILDLOG_STEP='timeout 60 sh -c "while :; do seq 1000; done"' node bench/buildlog.mjs
//
// envd cuts a command's output stream once its reader falls 32 MiB
// behind, which `yes` (GB/s) does within seconds whatever the reader;
// BUILDLOG_STEP runs another step, e.g. a slower flood that is not cut.
//
// The run is bounded: the server is killed if its RSS passes 4 GiB or the
// build has not ended after 150 s, and what was reached is reported.
import { execFileSync } from 'node:child_process'
import { readFileSync } from 'node:fs'
import path from 'node:path'
import { Template } from 'e2b'
import { startWarren, killAll } from '../setup/start-warren.mjs'

const rssLimitKB = 4 << 20 // 4 GiB
const budgetMs = 150_000
const step = process.env.BUILDLOG_STEP || 'timeout 60 yes'

// status reads a process's current and peak RSS (kB) from /proc.
function status(pid) {
  try {
    const s = readFileSync(`/proc/${pid}/status`, 'utf8')
    const kb = (k) => Number((s.match(new RegExp(`^${k}:\\s+(\\d+) kB`, 'm')) || [])[1] || 0)
    return { rss: kb('VmRSS'), peak: kb('VmHWM') }
  } catch {
    return null
  }
}

const w = await startWarren({ instance: 'blog', net16: 144, poolSize: 0 })
process.env.E2B_API_URL = w.apiUrl
process.env.E2B_SANDBOX_URL = w.sandboxUrl
process.env.E2B_API_KEY = w.apiKey
process.env.E2B_DOMAIN = 'localhost'
delete process.env.E2B_DEBUG

let peakKB = 0
let killed = ''
const started = Date.now()
const sampler = setInterval(() => {
  const s = status(w.pid)
  if (!s) return
  peakKB = Math.max(peakKB, s.peak, s.rss)
  if (s.rss > rssLimitKB && !killed) {
    killed = `RSS passed 4 GiB after ${((Date.now() - started) / 1000).toFixed(0)} s`
    process.kill(w.pid, 'SIGKILL')
  }
}, 100)

const tpl = Template().fromTemplate('base').runCmd(step)
const name = `buildlog-${Date.now().toString(36)}`
let outcome
let timer
try {
  await Promise.race([
    Template.build(tpl, name, { cpuCount: 1, memoryMB: 512 }).then(() => 'ready'),
    new Promise((_, reject) => { timer = setTimeout(() => reject(new Error(`no end within ${budgetMs / 1000} s`)), budgetMs) }),
  ])
  outcome = 'ready'
} catch (err) {
  outcome = `error: ${String(err.message || err).split('\n')[0].slice(0, 160)}`
}
clearTimeout(timer)
const elapsed = (Date.now() - started) / 1000
const s = status(w.pid)
if (s) peakKB = Math.max(peakKB, s.peak)
clearInterval(sampler)
if (!killed && elapsed * 1000 >= budgetMs) {
  killed = `build had not ended after ${budgetMs / 1000} s`
}

// Rows in the store (SQLite in the data dir), read after the server
// has had a moment to flush.
let rows = '-'
try {
  rows = execFileSync('sqlite3', [path.join(w.dataDir, 'warren.db'), 'SELECT COUNT(*) FROM build_logs'], { encoding: 'utf8' }).trim()
} catch (err) {
  rows = `unreadable: ${String(err.message).split('\n')[0]}`
}

if (!killed) await killAll(w).catch(() => {})
await w.stop({ removeDataDir: true }).catch(() => {})

console.log(`| binary | step | outcome | build-log rows | peak RSS (MiB) | elapsed (s) | note |`)
console.log(`|---|---|---|---|---|---|---|`)
console.log(`| ${process.env.WARREN_BINARY || 'bin/warren'} | RUN ${step} | ${outcome} | ${rows} | ${(peakKB / 1024).toFixed(0)} | ${elapsed.toFixed(0)} | ${killed || ''} |`)
