// API keys: list, create (the secret is shown once), revoke. E2B's API
// takes an access token for these: signed in with an API key, the page
// shows the API's message.
import { api } from './api.js'
import { h, fmtTime, showError } from './dom.js'

export async function keysPage() {
  const body = h('tbody')
  const created = h('div', { 'aria-live': 'polite' })
  const name = h('input', { id: 'key-name', name: 'name', required: true, maxlength: 256 })
  async function load() {
    const list = await api.get('/api-keys')
    body.replaceChildren(...list.map((k) => h('tr', { 'data-id': k.id },
      h('td', {}, k.name), h('td', { class: 'meta' }, k.mask ? `${k.mask.prefix}${k.mask.maskedValuePrefix || ''}…${k.mask.maskedValueSuffix || ''}` : ''),
      h('td', { class: 'opt' }, fmtTime(k.createdAt)), h('td', { class: 'opt' }, fmtTime(k.lastUsed)),
      h('td', {}, h('button', { type: 'button', class: 'danger', onclick: async () => {
        if (!confirm(`Revoke key ${k.name}?`)) return
        try { await api.del(`/api-keys/${k.id}`); await load() } catch (err) { showError(err) }
      } }, 'Revoke')))))
  }
  const form = h('form', { class: 'filters' }, h('label', { for: 'key-name' }, 'New key name', name), h('button', { type: 'submit' }, 'Create key'))
  form.addEventListener('submit', async (e) => {
    e.preventDefault()
    try {
      const k = await api.post('/api-keys', { name: name.value })
      created.replaceChildren(h('p', {}, 'Copy the new key now; it is not shown again:'), h('p', { class: 'secret', id: 'new-key' }, k.key))
      name.value = ''
      await load()
    } catch (err) { showError(err) }
  })
  let listError = null
  try { await load() } catch (err) { listError = err }
  if (listError) setTimeout(() => showError(listError), 0)
  return {
    title: 'API keys',
    el: h('section', { 'aria-labelledby': 'title' }, h('h1', { id: 'title' }, 'API keys'), form, created,
      h('div', { class: 'table-wrap' }, h('table', { id: 'keys' },
        h('thead', {}, h('tr', {}, ...['Name', 'Key', 'Created', 'Last used', ''].map((c, i) => h('th', { scope: 'col', class: i === 2 || i === 3 ? 'opt' : undefined }, c)))),
        body))),
  }
}
