// Team usage: concurrent sandboxes and start rate over time, computed in
// the page from the team's lifecycle events (GET /events/sandboxes, the
// store's events outbox) and its running count now (GET /v2/sandboxes).
// Bounded: at most maxEvents of the newest events (10 calls of 100).
//
// Concurrent running sandboxes are counted backwards from now: before an
// event that started one (created, resumed) there was one fewer, before
// one that stopped one (killed, paused) one more.
import { api, pages } from './api.js'
import { h, showError } from './dom.js'

const maxEvents = 1000
const starts = new Set(['sandbox.lifecycle.created', 'sandbox.lifecycle.resumed'])
const stops = new Set(['sandbox.lifecycle.killed', 'sandbox.lifecycle.paused'])
const types = [...starts, ...stops].join(',')

async function newestEvents() {
  const out = []
  for (let offset = 0; offset < maxEvents; offset += 100) {
    const page = await api.get(`/events/sandboxes?types=${types}&limit=100&offset=${offset}`)
    out.push(...page)
    if (page.length < 100) break
  }
  return out
}

// series turns the newest-first events and the running count now into
// [times (s)], [running] steps and per-minute starts.
export function series(events, runningNow, now = Date.now() / 1000) {
  const xs = [now]
  const ys = [runningNow]
  let n = runningNow
  for (const e of events) {
    const parsed = Date.parse(e.timestamp) / 1000
    if (!Number.isFinite(parsed)) continue
    // Never after the step drawn just later (events in one millisecond).
    const t = Math.min(parsed, xs[xs.length - 1])
    // The count right after the event is n; just before it, one less or more.
    xs.push(t)
    ys.push(n)
    if (starts.has(e.type)) n = Math.max(0, n - 1)
    else if (stops.has(e.type)) n += 1
    xs.push(t - 0.001)
    ys.push(n)
  }
  xs.reverse(); ys.reverse()
  // Starts per minute, in buckets of whole minutes: at most ~120 over the
  // window, empty ones drawn as 0 (one before and one after, too).
  const created = events.filter((e) => e.type === 'sandbox.lifecycle.created').map((e) => Date.parse(e.timestamp) / 1000).filter(Number.isFinite)
  if (!created.length) return { running: [xs, ys], rate: [[], []] }
  const first = Math.min(...created)
  const last = Math.max(...created)
  const bucket = 60 * Math.max(1, Math.ceil((last - first) / 60 / 120))
  const start = Math.floor(first / bucket) * bucket - bucket
  const buckets = Math.floor((last - start) / bucket) + 2
  const counts = new Array(buckets).fill(0)
  for (const t of created) counts[Math.floor((t - start) / bucket)]++
  const times = counts.map((_, i) => start + i * bucket)
  return { running: [xs, ys], rate: [times, counts.map((c) => c / (bucket / 60))] }
}

function plot(id, title, [xs, ys], opts = {}) {
  const box = h('div', { class: 'chart', id, 'data-points': String(xs.length) }, h('h3', {}, title))
  requestAnimationFrame(() => {
    if (!xs.length) { box.append(h('p', { class: 'muted' }, 'No data in the window.')); return }
    // eslint-disable-next-line no-new
    new window.uPlot({
      width: Math.max(240, box.clientWidth - 16), height: 180, legend: { show: false },
      series: [{}, { label: title, stroke: '#0b57d0', width: 2, fill: opts.fill, points: { show: xs.length < 20 }, paths: opts.paths }],
      scales: { x: { time: true }, y: { range: (u, min, max) => [0, Math.max(max * 1.2, 1)] } },
      axes: [{}, { size: 50 }],
    }, [xs, ys], box)
  })
  return box
}

export async function usagePage() {
  const [events, running] = await Promise.all([newestEvents(), pages('/v2/sandboxes?state=running&limit=100')])
  const { running: conc, rate } = series(events, running.length)
  const from = conc[0].length > 1 ? new Date(conc[0][0] * 1000).toLocaleString() : null
  const bars = window.uPlot.paths && window.uPlot.paths.bars ? window.uPlot.paths.bars({ size: [0.6, 40] }) : undefined
  setTimeout(() => showError(null), 0)
  return {
    title: 'Usage',
    el: h('section', { 'aria-labelledby': 'title' }, h('h1', { id: 'title' }, 'Team usage'),
      h('p', { class: 'muted', id: 'usage-summary' }, `${running.length} running now; ${events.length} lifecycle events${from ? ` since ${from}` : ''}` +
        (events.length >= maxEvents ? ` (the newest ${maxEvents})` : '') + '.'),
      h('div', { class: 'charts' },
        plot('chart-concurrent', 'Concurrent running sandboxes', conc),
        plot('chart-starts', 'Sandbox starts per minute', rate, { paths: bars, fill: 'rgba(11,87,208,.3)' }))),
  }
}
