// Secrets (names and versions; their values are never shown, nor served
// by the API) and volumes (names and IDs).
import { pages, api } from './api.js'
import { h, fmtTime } from './dom.js'

function table(id, heads, rows, empty) {
  return h('div', { class: 'table-wrap' }, h('table', { id },
    h('thead', {}, h('tr', {}, heads.map((c) => h('th', { scope: 'col' }, c)))),
    h('tbody', {}, rows.length ? rows : h('tr', {}, h('td', { colspan: heads.length, class: 'muted' }, empty)))))
}

export async function secretsPage() {
  const list = await pages('/secrets?limit=100')
  const rows = list.map((s) => h('tr', { 'data-id': s.secretID },
    h('td', {}, s.name), h('td', {}, String(s.currentVersion)),
    h('td', { class: 'meta' }, Object.entries(s.metadata || {}).map(([k, v]) => `${k}=${v}`).join(', ')),
    h('td', {}, fmtTime(s.updatedAt))))
  return {
    title: 'Secrets',
    el: h('section', { 'aria-labelledby': 'title' }, h('h1', { id: 'title' }, 'Secrets'),
      h('p', { class: 'muted' }, 'Names and versions only: a secret\'s value is never shown.'),
      table('secrets', ['Name', 'Version', 'Metadata', 'Updated'], rows, 'No secrets in your team.')),
  }
}

export async function volumesPage() {
  const list = await api.get('/volumes')
  const rows = (list || []).map((v) => h('tr', { 'data-id': v.volumeID }, h('td', {}, v.name), h('td', { class: 'meta' }, v.volumeID)))
  return {
    title: 'Volumes',
    el: h('section', { 'aria-labelledby': 'title' }, h('h1', { id: 'title' }, 'Volumes'),
      table('volumes', ['Name', 'ID'], rows, 'No volumes in your team.')),
  }
}
