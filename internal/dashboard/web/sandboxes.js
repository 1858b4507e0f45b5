// The sandboxes list: running and paused, filtered by state, metadata
// and template, refreshed every few seconds, with kill, pause, resume
// and extend-timeout on each row.
import { api, pages } from './api.js'
import { waitVisible, h, fmtTime, fmtBytes, showError } from './dom.js'

const refreshMs = 5000

export async function sandboxesPage() {
  const params = new URLSearchParams(sessionStorage.getItem('warren.filters') || '')
  const state = h('select', { id: 'f-state', name: 'state' },
    h('option', { value: 'running,paused' }, 'running and paused'),
    h('option', { value: 'running' }, 'running'),
    h('option', { value: 'paused' }, 'paused'))
  state.value = params.get('state') || 'running,paused'
  const meta = h('input', { id: 'f-meta', name: 'metadata', placeholder: 'key=value, …', value: params.get('metadata') || '' })
  const tmpl = h('input', { id: 'f-template', name: 'template', placeholder: 'template ID or alias', value: params.get('template') || '' })
  const count = h('p', { id: 'count', class: 'muted', 'aria-live': 'polite' })
  const body = h('tbody')
  const table = h('div', { class: 'table-wrap' }, h('table', { id: 'sandboxes' },
    h('caption', { class: 'muted', style: 'text-align:left' }, 'Sandboxes of your team'),
    h('thead', {}, h('tr', {}, h('th', { scope: 'col' }, 'Sandbox'), h('th', { scope: 'col' }, 'State'), h('th', { scope: 'col' }, 'Template'),
      h('th', { scope: 'col' }, 'Metadata'), h('th', { scope: 'col', class: 'opt' }, 'CPU · memory'), h('th', { scope: 'col', class: 'opt' }, 'Node'), h('th', { scope: 'col', class: 'opt' }, 'Ends'),
      h('th', { scope: 'col' }, 'Actions'))),
    body))
  const form = h('form', { class: 'filters', role: 'search' },
    h('label', { for: 'f-state' }, 'State', state), h('label', { for: 'f-meta' }, 'Metadata', meta),
    h('label', { for: 'f-template' }, 'Template', tmpl), h('button', { type: 'submit' }, 'Filter'))
  form.addEventListener('submit', (e) => { e.preventDefault(); load() })
  state.addEventListener('change', () => load())

  let timer = null
  let stopped = false
  async function load() {
    clearTimeout(timer)
    const q = new URLSearchParams()
    q.set('state', state.value)
    if (meta.value.trim()) {
      // E2B's metadata filter: key=value pairs joined by &, URL-encoded as one parameter.
      const pairs = meta.value.split(',').map((s) => s.trim()).filter(Boolean)
      q.set('metadata', pairs.join('&'))
    }
    q.set('limit', '100')
    if (tmpl.value.trim()) q.set('template', tmpl.value.trim())
    sessionStorage.setItem('warren.filters', new URLSearchParams({ state: state.value, metadata: meta.value, template: tmpl.value }).toString())
    try {
      const list = await pages('/v2/sandboxes?' + q.toString())
      // The latest sample of the first 100 running ones (E2B's dashboard call).
      const ids = list.filter((s) => s.state === 'running').slice(0, 100).map((s) => s.sandboxID)
      const metrics = ids.length ? (await api.get('/sandboxes/metrics?sandbox_ids=' + ids.join(','))).sandboxes : {}
      render(list, metrics)
      showError(null)
    } catch (err) { showError(err) }
    if (!stopped) timer = setTimeout(() => (document.hidden ? waitVisible(() => !stopped && load()) : load()), refreshMs)
  }

  function act(label, fn, cls) {
    return h('button', { type: 'button', class: cls, onclick: async (e) => {
      e.target.disabled = true
      try { await fn(); await load() } catch (err) { showError(err) } finally { e.target.disabled = false }
    } }, label)
  }

  function render(list, metrics) {
    const running = list.filter((s) => s.state === 'running').length
    count.textContent = `${list.length} ${list.length === 1 ? 'sandbox' : 'sandboxes'}: ${running} running, ${list.length - running} paused`
    const rows = list.map((s) => {
      const id = s.sandboxID
      const actions = [
        act('Kill', async () => { if (confirm(`Kill sandbox ${id}?`)) await api.del(`/sandboxes/${id}`) }, 'danger kill'),
        s.state === 'running'
          ? act('Pause', () => api.post(`/sandboxes/${id}/pause`), 'pause')
          : act('Resume', () => api.post(`/sandboxes/${id}/connect`, { timeout: 300 }), 'resume'),
      ]
      if (s.state === 'running') actions.push(act('+5 min', () => api.post(`/sandboxes/${id}/timeout`, { timeout: Math.max(0, (new Date(s.endAt) - Date.now()) / 1000) + 300 | 0 }), 'extend'))
      const md = Object.entries(s.metadata || {}).map(([k, v]) => `${k}=${v}`).join(', ')
      return h('tr', { 'data-id': id, 'data-state': s.state },
        h('td', {}, h('a', { href: `#/sandboxes/${id}` }, id)),
        h('td', { class: `state-${s.state}` }, s.state),
        h('td', {}, s.alias || s.templateID),
        h('td', { class: 'meta' }, md),
        h('td', { class: 'opt metrics' }, metrics[id] ? `${metrics[id].cpuUsedPct.toFixed(0)}% · ${fmtBytes(metrics[id].memUsed)}` : ''),
        h('td', { class: 'opt' }, s.clientID || ''),
        h('td', { class: 'opt' }, fmtTime(s.endAt)),
        h('td', {}, h('div', { class: 'actions', 'aria-label': `Actions for ${id}`, role: 'group' }, actions)))
    })
    body.replaceChildren(...rows)
    if (!rows.length) body.replaceChildren(h('tr', {}, h('td', { colspan: 8, class: 'muted' }, 'No sandboxes match.')))
  }

  await load()
  return {
    title: 'Sandboxes',
    el: h('section', { 'aria-labelledby': 'title' }, h('h1', { id: 'title' }, 'Sandboxes'), form, count, table),
    cleanup: () => { stopped = true; clearTimeout(timer) },
  }
}
