// Nodes (the admin's listener only, signed in with the admin token):
// state, capacity and use, cordon, uncordon and drain, refreshed every 5 s.
import { call } from './api.js'
import { h, fmtTime, showError, waitVisible } from './dom.js'

const admin = (method, path) => call(method, path, undefined, '/dashboard/admin')

export async function nodesPage() {
  const body = h('tbody')
  let timer = null
  let stopped = false
  function act(label, n, action, cls) {
    return h('button', { type: 'button', class: cls, onclick: async (e) => {
      if (action === 'drain' && !confirm(`Drain node ${n.name}? Its sandboxes are paused.`)) return
      e.target.disabled = true
      try { await admin('POST', `/nodes/${encodeURIComponent(n.name)}/${action}`); await load() } catch (err) { showError(err) } finally { e.target.disabled = false }
    } }, label)
  }
  async function load() {
    clearTimeout(timer)
    try {
      const list = await admin('GET', '/nodes')
      body.replaceChildren(...list.map((n) => h('tr', { 'data-name': n.name, 'data-state': n.state },
        h('td', {}, n.name), h('td', { class: `state-${n.state === 'ready' ? 'running' : 'paused'}` }, n.state),
        h('td', {}, `${n.sandboxes}${n.maxSandboxes ? ' / ' + n.maxSandboxes : ''}`),
        h('td', {}, `${n.usedCpus} / ${n.cpus}`), h('td', {}, `${n.usedMemoryMB} / ${n.memoryMB} MiB`),
        h('td', { class: 'opt' }, `${n.freeDiskMB} of ${n.diskMB} MiB free`),
        h('td', { class: 'opt meta' }, [n.address, n.runtime, ...Object.entries(n.labels || {}).map(([k, v]) => `${k}=${v}`)].filter(Boolean).join(' · ')),
        h('td', { class: 'opt' }, fmtTime(n.heartbeatAt)),
        h('td', {}, h('div', { class: 'actions', role: 'group', 'aria-label': `Actions for ${n.name}` },
          n.state === 'ready' ? act('Cordon', n, 'cordon', 'cordon') : act('Uncordon', n, 'uncordon', 'uncordon'),
          n.state !== 'draining' ? act('Drain', n, 'drain', 'danger drain') : null)))))
      if (!list.length) body.replaceChildren(h('tr', {}, h('td', { colspan: 9, class: 'muted' }, 'No nodes registered.')))
      showError(null)
    } catch (err) { showError(err) }
    if (!stopped) timer = setTimeout(() => (document.hidden ? waitVisible(() => !stopped && load()) : load()), 5000)
  }
  await load()
  return {
    title: 'Nodes',
    el: h('section', { 'aria-labelledby': 'title' }, h('h1', { id: 'title' }, 'Nodes'),
      h('p', { class: 'muted' }, 'Cordon: no new sandboxes; drain: its sandboxes are paused too (they resume elsewhere in a cluster).'),
      h('div', { class: 'table-wrap' }, h('table', { id: 'nodes' },
        h('thead', {}, h('tr', {}, ...['Node', 'State', 'Sandboxes', 'CPUs used', 'Memory used', 'Disk', 'Where', 'Heartbeat', 'Actions'].map((c, i) => h('th', { scope: 'col', class: i >= 5 && i <= 7 ? 'opt' : undefined }, c)))),
        body))),
    cleanup: () => { stopped = true; clearTimeout(timer) },
  }
}
