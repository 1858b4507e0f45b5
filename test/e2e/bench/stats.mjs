// Small helpers for benchmark tables: percentiles and aligned rows, and
// the create → first command measure several tables share.
import { Sandbox } from 'e2b'

export function percentile(sorted, p) {
  if (sorted.length === 0) return NaN
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))
  return sorted[i]
}

// measure runs fn n times (after warmup runs) within a time budget and
// returns the sorted durations in milliseconds. With sample: true, fn
// measures itself and returns the duration.
export async function measure(fn, { n, warmup = 5, budgetMs = 60_000, sample = false }) {
  const deadline = Date.now() + budgetMs
  for (let i = 0; i < warmup && Date.now() < deadline; i++) await fn()
  const out = []
  for (let i = 0; i < n && Date.now() < deadline; i++) {
    const t0 = performance.now()
    const v = await fn()
    out.push(sample ? v : performance.now() - t0)
  }
  return out.sort((a, b) => a - b)
}

export class Table {
  rows = []
  latency(metric, samples, target = '') {
    const sorted = [...samples].sort((a, b) => a - b)
    this.rows.push([metric, String(sorted.length), fmt(percentile(sorted, 50)), fmt(percentile(sorted, 99)), 'ms', target])
  }
  throughput(metric, samples, target = '') {
    // samples are MB/s; p99 of a throughput is its 1st percentile (the slow tail).
    const sorted = [...samples].sort((a, b) => a - b)
    this.rows.push([metric, String(sorted.length), fmt(percentile(sorted, 50)), fmt(percentile(sorted, 1)), 'MB/s', target])
  }
  count(metric, samples, target = '') {
    const sorted = [...samples].sort((a, b) => a - b)
    const f = (v) => (Number.isInteger(v) ? String(v) : fmt(v))
    this.rows.push([metric, String(sorted.length), f(percentile(sorted, 50)), f(percentile(sorted, 99)), 'count', target])
  }
  print() {
    const head = ['metric', 'n', 'p50', 'p99', 'unit', 'target']
    const all = [head, ...this.rows]
    const w = head.map((_, i) => Math.max(...all.map((r) => r[i].length)))
    const line = (r) => '| ' + r.map((c, i) => c.padEnd(w[i])).join(' | ') + ' |'
    console.log(line(head))
    console.log('|' + w.map((x) => '-'.repeat(x + 2)).join('|') + '|')
    for (const r of this.rows) console.log(line(r))
  }
}

function fmt(v) {
  if (Number.isNaN(v)) return '-'
  return v >= 100 ? v.toFixed(0) : v.toFixed(2)
}

// withTimeout bounds one operation, so that a hang cannot stall the run.
export async function withTimeout(p, ms, what) {
  let timer
  const t = new Promise((_, reject) => { timer = setTimeout(() => reject(new Error(`${what}: no answer within ${ms} ms`)), ms) })
  try {
    return await Promise.race([p, t])
  } finally {
    clearTimeout(timer)
  }
}

// createToCommand times Sandbox.create + the first commands.run, then
// kills the sandbox (not timed).
export async function createToCommand(conn) {
  const t0 = performance.now()
  const sbx = await Sandbox.create(conn)
  await sbx.commands.run('true')
  const ms = performance.now() - t0
  await sbx.kill()
  return ms
}
