// A sandbox's page: its record, CPU/memory/disk charts from its metrics,
// its logs (envd's and the egress audit's), a terminal over envd's PTY
// and a file browser over envd's filesystem and /files.
import { api, rpc, stream, readFile, writeFile } from './api.js'
import { waitVisible, h, fmtTime, fmtBytes, showError } from './dom.js'

const refreshMs = 5000

function info(sb) {
  const rows = [
    ['ID', sb.sandboxID], ['State', sb.state], ['Template', sb.alias && sb.alias !== sb.templateID ? `${sb.alias} (${sb.templateID})` : sb.templateID],
    ['Node', sb.clientID], ['CPUs', sb.cpuCount], ['Memory', `${sb.memoryMB} MiB`], ['Disk', `${sb.diskSizeMB} MiB`],
    ['Started', fmtTime(sb.startedAt)], ['Ends', fmtTime(sb.endAt)], ['envd', sb.envdVersion],
    ['Metadata', Object.entries(sb.metadata || {}).map(([k, v]) => `${k}=${v}`).join(', ')],
  ]
  if (sb.allowInternetAccess != null) rows.push(['Internet', sb.allowInternetAccess ? 'allowed' : 'denied'])
  if (sb.network) rows.push(['Egress policy', JSON.stringify(sb.network)])
  if (sb.lifecycle) rows.push(['On timeout', `${sb.lifecycle.onTimeout}${sb.lifecycle.autoResume ? ', resumes on traffic' : ''}`])
  return h('dl', { class: 'info', id: 'info' }, rows.flatMap(([k, v]) => [h('dt', {}, k), h('dd', {}, v ?? '')]))
}

// chart draws one series over time with uPlot; its element carries the
// number of points drawn (data-points).
function chart(id, title, unit) {
  const box = h('div', { class: 'chart', id, 'data-points': '0' }, h('h3', {}, title))
  let plot = null
  return {
    el: box,
    set(xs, ys) {
      box.dataset.points = String(xs.length)
      const width = Math.max(240, box.clientWidth - 16)
      if (!plot) {
        plot = new window.uPlot({
          width, height: 150, legend: { show: false },
          series: [{}, { label: title, stroke: '#0b57d0', width: 2, points: { show: xs.length < 3 } }],
          scales: { x: { time: true, range: (u, min, max) => [Math.min(min, max - 60), max + 5] }, y: { range: (u, min, max) => [0, Math.max(max * 1.2, 1)] } },
          axes: [{}, { size: 70, values: (u, vals) => vals.map((v) => unit(v)) }],
        }, [xs, ys], box)
      } else {
        plot.setSize({ width, height: 150 })
        plot.setData([xs, ys])
      }
    },
    destroy() { if (plot) plot.destroy() },
  }
}

function terminal(id) {
  const box = h('div', { id: 'terminal', 'aria-label': 'Terminal: a shell in the sandbox', role: 'region' })
  const status = h('p', { class: 'muted', id: 'terminal-status' }, 'Not connected.')
  const start = h('button', { type: 'button', id: 'terminal-start' }, 'Open terminal')
  let term, fit, pid, abort, ro
  async function open() {
    start.disabled = true
    // xterm.js is most of the page's code: loaded when a terminal opens.
    const [{ Terminal }, { FitAddon }] = await Promise.all([import('./vendor/xterm.mjs'), import('./vendor/addon-fit.mjs')])
    term = new Terminal({ fontSize: 13, convertEol: false, screenReaderMode: true })
    fit = new FitAddon()
    term.loadAddon(fit)
    term.open(box)
    fit.fit()
    abort = new AbortController()
    const inputQueue = []
    let sending = false
    async function flush() {
      if (sending || pid === undefined) return
      sending = true
      while (inputQueue.length) {
        const data = inputQueue.splice(0).join('')
        const bytes = new TextEncoder().encode(data)
        try { await rpc(id, 'process.Process/SendInput', { process: { pid }, input: { pty: b64(bytes) } }) } catch (err) { showError(err) }
      }
      sending = false
    }
    term.onData((d) => { inputQueue.push(d); flush() })
    term.onResize(({ cols, rows }) => {
      if (pid !== undefined) rpc(id, 'process.Process/Update', { process: { pid }, pty: { size: { cols, rows } } }).catch(() => {})
    })
    ro = new ResizeObserver(() => fit.fit())
    ro.observe(box)
    status.textContent = 'Connecting…'
    stream(id, 'process.Process/Start', {
      process: { cmd: '/bin/bash', args: ['-i', '-l'], envs: { TERM: 'xterm-256color' } },
      pty: { size: { cols: term.cols, rows: term.rows } },
    }, (msg) => {
      const ev = msg.event || {}
      if (ev.start) { pid = ev.start.pid; status.textContent = `Connected (pid ${pid}).`; flush(); term.focus() }
      if (ev.data && ev.data.pty) term.write(unb64(ev.data.pty))
      if (ev.end) status.textContent = `The shell ended: ${ev.end.status || ev.end.exitCode}`
    }, abort.signal).then(() => {
      if (!status.textContent.startsWith('The shell')) status.textContent = 'Disconnected.'
    }).catch((err) => {
      if (err.name !== 'AbortError') { status.textContent = 'Disconnected: ' + err.message; showError(err) }
    })
  }
  start.addEventListener('click', open)
  return {
    el: h('section', { 'aria-labelledby': 'term-title' }, h('h2', { id: 'term-title' }, 'Terminal'), start, status, box),
    destroy() { if (abort) abort.abort(); if (ro) ro.disconnect(); if (term) term.dispose() },
  }
}

function b64(bytes) { let s = ''; for (const b of bytes) s += String.fromCharCode(b); return btoa(s) }
function unb64(s) { const bin = atob(s); const out = new Uint8Array(bin.length); for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i); return out }

function files(id) {
  const pathInput = h('input', { id: 'files-path', name: 'path', value: '/home/user', 'aria-label': 'Directory' })
  const list = h('ul', { id: 'files-list' })
  const preview = h('pre', { class: 'logs', id: 'file-preview', hidden: true })
  const upload = h('input', { type: 'file', id: 'files-upload', 'aria-label': 'Upload a file into this directory' })
  async function ls(dir) {
    pathInput.value = dir
    try {
      const res = await rpc(id, 'filesystem.Filesystem/ListDir', { path: dir, depth: 1 })
      const entries = (res.entries || []).sort((a, b) => (a.type === b.type ? a.name.localeCompare(b.name) : a.type === 'FILE_TYPE_DIRECTORY' ? -1 : 1))
      const up = dir.replace(/\/[^/]+\/?$/, '') || '/'
      list.replaceChildren(
        dir !== '/' ? h('li', {}, h('button', { type: 'button', class: 'link', onclick: () => ls(up) }, '..')) : null,
        ...entries.map((e) => e.type === 'FILE_TYPE_DIRECTORY'
          ? h('li', {}, h('button', { type: 'button', class: 'link', onclick: () => ls(e.path) }, e.name + '/'))
          : h('li', { 'data-path': e.path }, h('button', { type: 'button', class: 'link', onclick: () => show(e) }, e.name), ' ',
            h('span', { class: 'muted' }, fmtBytes(Number(e.size))), ' ',
            h('button', { type: 'button', onclick: () => download(e) }, 'Download'))))
    } catch (err) { showError(err) }
  }
  async function show(e) {
    try {
      const blob = await readFile(id, e.path)
      preview.textContent = blob.size > 256 * 1024 ? `(${fmtBytes(blob.size)}: too large to show; download it)` : await blob.text()
      preview.hidden = false
      preview.dataset.path = e.path
    } catch (err) { showError(err) }
  }
  async function download(e) {
    try {
      const url = URL.createObjectURL(await readFile(id, e.path))
      const a = h('a', { href: url, download: e.name })
      document.body.append(a); a.click(); a.remove()
      setTimeout(() => URL.revokeObjectURL(url), 10000)
    } catch (err) { showError(err) }
  }
  upload.addEventListener('change', async () => {
    const f = upload.files[0]
    if (!f) return
    const dir = pathInput.value.replace(/\/$/, '')
    try { await writeFile(id, `${dir}/${f.name}`, f); upload.value = ''; await ls(pathInput.value) } catch (err) { showError(err) }
  })
  const form = h('form', { class: 'filters' }, h('label', { for: 'files-path' }, 'Directory', pathInput), h('button', { type: 'submit' }, 'List'),
    h('label', { for: 'files-upload' }, 'Upload', upload))
  form.addEventListener('submit', (e) => { e.preventDefault(); ls(pathInput.value) })
  return { el: h('section', { class: 'files', 'aria-labelledby': 'files-title' }, h('h2', { id: 'files-title' }, 'Files'), form, list, preview), ls }
}

// snapshots lists the sandbox's snapshots, takes one, and forks the
// sandbox (both keep it running).
function snapshots(id) {
  const list = h('ul', { id: 'snapshots' })
  const out = h('p', { 'aria-live': 'polite', id: 'fork-result' })
  async function load() {
    try {
      const snaps = await api.get(`/snapshots?sandboxID=${id}`)
      list.replaceChildren(...(snaps.length ? snaps.map((s) => h('li', {}, `${(s.names || []).join(', ') || '(unnamed)'} `, h('span', { class: 'meta' }, s.snapshotID)))
        : [h('li', { class: 'muted' }, 'No snapshots.')]))
    } catch (err) { showError(err) }
  }
  const busy = (fn) => async (e) => {
    e.target.disabled = true
    try { await fn() } catch (err) { showError(err) } finally { e.target.disabled = false }
  }
  const take = h('button', { type: 'button', onclick: busy(async () => { await api.post(`/sandboxes/${id}/snapshots`, {}); await load() }) }, 'Take a snapshot')
  const fork = h('button', { type: 'button', onclick: busy(async () => {
    const res = await api.post(`/sandboxes/${id}/fork`, { timeout: 300 })
    out.replaceChildren(...res.map((r) => (r.sandbox ? h('a', { href: `#/sandboxes/${r.sandbox.sandboxID}` }, `Fork ${r.sandbox.sandboxID}`) : `Fork failed: ${r.error && r.error.message}`)))
  }) }, 'Fork')
  return { el: h('section', { 'aria-labelledby': 'snap-title' }, h('h2', { id: 'snap-title' }, 'Snapshots and forks'), h('div', { class: 'filters' }, take, fork), out, list), load }
}

export async function sandboxPage(id) {
  const sb = await api.get(`/sandboxes/${id}`)
  const infoBox = h('div', {}, info(sb))
  const cpu = chart('chart-cpu', 'CPU %', (v) => `${v.toFixed(0)}%`)
  const mem = chart('chart-mem', 'Memory', fmtBytes)
  const disk = chart('chart-disk', 'Disk', fmtBytes)
  const logs = h('pre', { class: 'logs', id: 'logs', tabindex: 0, 'aria-label': 'Sandbox logs' })
  const term = terminal(id)
  const fb = files(id)
  const snaps = snapshots(id)
  let timer = null
  let stopped = false
  async function refresh() {
    try {
      const [rec, samples, lg] = await Promise.all([
        api.get(`/sandboxes/${id}`),
        api.get(`/sandboxes/${id}/metrics`),
        api.get(`/v2/sandboxes/${id}/logs?limit=200&direction=backward`),
      ])
      infoBox.replaceChildren(info(rec))
      const xs = samples.map((m) => m.timestampUnix)
      cpu.set(xs, samples.map((m) => m.cpuUsedPct))
      mem.set(xs, samples.map((m) => m.memUsed))
      disk.set(xs, samples.map((m) => m.diskUsed))
      const entries = (lg.logs || []).slice().sort((a, b) => new Date(a.timestamp) - new Date(b.timestamp))
      logs.textContent = entries.map((e) => `${e.timestamp} ${e.level || ''} ${(e.fields && e.fields.source) || ''} ${e.message}`).join('\n') || '(no logs yet)'
    } catch (err) { showError(err) }
    if (!stopped) timer = setTimeout(() => (document.hidden ? waitVisible(() => !stopped && refresh()) : refresh()), refreshMs)
  }
  const el = h('section', { 'aria-labelledby': 'title' },
    h('p', {}, h('a', { href: '#/sandboxes' }, '← Sandboxes')),
    h('h1', { id: 'title' }, `Sandbox ${id}`), infoBox,
    h('h2', {}, 'Metrics'), h('div', { class: 'charts' }, cpu.el, mem.el, disk.el),
    h('h2', {}, 'Logs'), logs, term.el, fb.el, snaps.el)
  // Charts size to their boxes: draw once the page is in the document.
  setTimeout(refresh, 0)
  if (sb.state === 'running') setTimeout(() => fb.ls('/home/user'), 0)
  setTimeout(() => snaps.load(), 0)
  return {
    title: `Sandbox ${id}`, el,
    cleanup: () => { stopped = true; clearTimeout(timer); term.destroy(); cpu.destroy(); mem.destroy(); disk.destroy() },
  }
}
