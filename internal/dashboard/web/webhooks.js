// Webhooks (E2B's /events/webhooks): list, create, enable or disable,
// delete, and one webhook's recent delivery attempts. The signature
// secret is sent on create and never shown back (the API never serves it).
import { api } from './api.js'
import { h, fmtTime, showError } from './dom.js'

const eventTypes = ['sandbox.lifecycle.created', 'sandbox.lifecycle.killed', 'sandbox.lifecycle.updated',
  'sandbox.lifecycle.paused', 'sandbox.lifecycle.resumed', 'sandbox.lifecycle.checkpointed']

export async function webhooksPage() {
  const body = h('tbody')
  async function load() {
    const list = await api.get('/events/webhooks')
    body.replaceChildren(...list.map((wh) => h('tr', { 'data-id': wh.id, 'data-enabled': String(wh.enabled) },
      h('td', {}, h('a', { href: `#/webhooks/${encodeURIComponent(wh.id)}` }, wh.name)),
      h('td', { class: 'meta' }, wh.url),
      h('td', { class: 'opt meta' }, (wh.events || []).map((e) => e.replace('sandbox.lifecycle.', '')).join(', ')),
      h('td', {}, wh.enabled ? 'enabled' : 'disabled'),
      h('td', {}, h('div', { class: 'actions', role: 'group', 'aria-label': `Actions for ${wh.name}` },
        h('button', { type: 'button', class: 'toggle', onclick: async () => {
          try { await api.patch(`/events/webhooks/${encodeURIComponent(wh.id)}`, { enabled: !wh.enabled }); await load() } catch (err) { showError(err) }
        } }, wh.enabled ? 'Disable' : 'Enable'),
        h('button', { type: 'button', class: 'danger delete', onclick: async () => {
          if (!confirm(`Delete webhook ${wh.name}?`)) return
          try { await api.del(`/events/webhooks/${encodeURIComponent(wh.id)}`); await load() } catch (err) { showError(err) }
        } }, 'Delete'))))))
    if (!list.length) body.replaceChildren(h('tr', {}, h('td', { colspan: 5, class: 'muted' }, 'No webhooks in your team.')))
  }

  const name = h('input', { id: 'wh-name', name: 'name', required: true, maxlength: 256 })
  const url = h('input', { id: 'wh-url', name: 'url', type: 'url', required: true, placeholder: 'https://…' })
  const secret = h('input', { id: 'wh-secret', name: 'secret', type: 'password', autocomplete: 'new-password', required: true, minlength: 1 })
  const boxes = eventTypes.map((t) => h('label', { class: 'check' }, h('input', { type: 'checkbox', name: 'events', value: t, checked: true }), t.replace('sandbox.lifecycle.', '')))
  const form = h('form', { class: 'filters', id: 'wh-form', 'aria-labelledby': 'wh-new' },
    h('label', { for: 'wh-name' }, 'Name', name), h('label', { for: 'wh-url' }, 'URL', url),
    h('label', { for: 'wh-secret' }, 'Signature secret (not shown again)', secret),
    h('fieldset', { class: 'events' }, h('legend', {}, 'Events'), boxes),
    h('button', { type: 'submit' }, 'Create webhook'))
  form.addEventListener('submit', async (e) => {
    e.preventDefault()
    const events = boxes.map((b) => b.querySelector('input')).filter((i) => i.checked).map((i) => i.value)
    try {
      await api.post('/events/webhooks', { name: name.value, url: url.value, enabled: true, events, signatureSecret: secret.value })
      form.reset()
      showError(null)
      await load()
    } catch (err) { showError(err) }
  })
  await load()
  return {
    title: 'Webhooks',
    el: h('section', { 'aria-labelledby': 'title' }, h('h1', { id: 'title' }, 'Webhooks'),
      h('p', { class: 'muted' }, 'Each delivery is signed with the webhook\'s secret; the secret is never shown back.'),
      h('h2', { id: 'wh-new' }, 'New webhook'), form,
      h('div', { class: 'table-wrap' }, h('table', { id: 'webhooks' },
        h('thead', {}, h('tr', {}, ...['Name', 'URL', 'Events', 'State', 'Actions'].map((c, i) => h('th', { scope: 'col', class: i === 2 ? 'opt' : undefined }, c)))),
        body))),
  }
}

export async function webhookPage(id) {
  const wh = await api.get(`/events/webhooks/${encodeURIComponent(id)}`)
  const body = h('tbody')
  let timer = null
  let stopped = false
  async function load() {
    clearTimeout(timer)
    try {
      const list = await api.get(`/events/webhooks/${encodeURIComponent(id)}/deliveries?limit=50`)
      body.replaceChildren(...list.map((a) => h('tr', { 'data-event': a.eventId, 'data-status': String(a.status) },
        h('td', {}, fmtTime(a.timestamp)), h('td', { class: 'meta' }, a.eventType), h('td', {}, String(a.attempt)),
        h('td', { class: a.status >= 200 && a.status < 300 ? 'state-running' : 'error-text' }, a.status ? String(a.status) : '—'),
        h('td', { class: 'opt' }, `${a.durationMs} ms`), h('td', { class: 'meta' }, a.error || ''))))
      if (!list.length) body.replaceChildren(h('tr', {}, h('td', { colspan: 6, class: 'muted' }, 'No deliveries yet.')))
    } catch (err) { showError(err) }
    if (!stopped) timer = setTimeout(load, 3000)
  }
  await load()
  return {
    title: `Webhook ${wh.name}`,
    el: h('section', { 'aria-labelledby': 'title' }, h('p', {}, h('a', { href: '#/webhooks' }, '← Webhooks')),
      h('h1', { id: 'title' }, `Webhook ${wh.name}`),
      h('dl', { class: 'info' }, h('dt', {}, 'URL'), h('dd', {}, wh.url), h('dt', {}, 'State'), h('dd', {}, wh.enabled ? 'enabled' : 'disabled'),
        h('dt', {}, 'Events'), h('dd', {}, (wh.events || []).join(', ')), h('dt', {}, 'Created'), h('dd', {}, fmtTime(wh.createdAt))),
      h('h2', {}, 'Recent deliveries'),
      h('div', { class: 'table-wrap' }, h('table', { id: 'deliveries' },
        h('thead', {}, h('tr', {}, ...['Time', 'Event', 'Attempt', 'Status', 'Duration', 'Error'].map((c, i) => h('th', { scope: 'col', class: i === 4 ? 'opt' : undefined }, c)))),
        body))),
    cleanup: () => { stopped = true; clearTimeout(timer) },
  }
}
