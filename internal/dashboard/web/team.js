// Secrets (names and versions; their values are never shown, nor served
// by the API) and volumes (names and IDs; a volume's files browsed,
// uploaded and deleted through the volume content API, whose token the
// server adds).
import { pages, api, call, send } from './api.js'
import { h, fmtTime, fmtBytes, showError } from './dom.js'

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
  const rows = (list || []).map((v) => h('tr', { 'data-id': v.volumeID }, h('td', {}, h('a', { href: `#/volumes/${encodeURIComponent(v.volumeID)}` }, v.name)), h('td', { class: 'meta' }, v.volumeID)))
  return {
    title: 'Volumes',
    el: h('section', { 'aria-labelledby': 'title' }, h('h1', { id: 'title' }, 'Volumes'),
      table('volumes', ['Name', 'ID'], rows, 'No volumes in your team.')),
  }
}

// volumePage browses a volume's files: a directory's entries, a file's
// first 64 KiB shown as text, any file downloaded or deleted, a file
// uploaded into the directory shown (replacing one of the same name).
export async function volumePage(id) {
  const v = await api.get(`/volumes/${encodeURIComponent(id)}`)
  const base = `/volumecontent/${encodeURIComponent(id)}`
  const where = h('p', { class: 'meta', id: 'vol-path', 'aria-live': 'polite' })
  let current = '/'
  const upload = h('input', { type: 'file', id: 'vol-upload', 'aria-label': 'Upload a file into this directory' })
  upload.addEventListener('change', async () => {
    const f = upload.files[0]
    if (!f) return
    const p = `${current === '/' ? '' : current}/${f.name}`
    try {
      await send('PUT', `${base}/file?path=${encodeURIComponent(p)}&force=true`, f)
      upload.value = ''
      await open(current)
    } catch (err) { showError(err) }
  })
  const remove = (p, name) => h('button', { type: 'button', class: 'danger', 'aria-label': `Delete ${name}`, onclick: async () => {
    if (!confirm(`Delete ${p} from volume ${v.name}?`)) return
    try {
      await call('DELETE', `${base}/path?path=${encodeURIComponent(p)}`)
      await open(current)
    } catch (err) { showError(err) }
  } }, 'Delete')
  const list = h('ul', { id: 'vol-list' })
  const preview = h('pre', { class: 'logs', id: 'vol-preview', tabindex: 0, 'aria-label': 'File contents' }, '')
  async function fetchFile(p) {
    const res = await fetch(`/dashboard/api${base}/file?path=${encodeURIComponent(p)}`, { headers: { 'X-Warren-Dashboard': '1' }, credentials: 'same-origin' })
    if (!res.ok) {
      let msg = `${res.status}`
      try { msg = (await res.json()).message || msg } catch { /* keep the status */ }
      throw new Error(msg)
    }
    return res.blob()
  }
  async function open(dir) {
    try {
      const entries = await call('GET', `${base}/dir?path=${encodeURIComponent(dir)}`)
      where.textContent = dir
      current = dir
      entries.sort((a, b) => (a.type === b.type ? a.name.localeCompare(b.name) : a.type === 'directory' ? -1 : 1))
      const up = dir === '/' ? [] : [h('li', {}, h('button', { type: 'button', class: 'link', onclick: () => open(dir.replace(/\/[^/]+\/?$/, '') || '/') }, '..'))]
      list.replaceChildren(...up, ...entries.map((e) => {
        const p = e.path.startsWith('/') ? e.path : '/' + e.path
        if (e.type === 'directory') return h('li', { 'data-path': p }, h('button', { type: 'button', class: 'link', onclick: () => open(p) }, e.name + '/'), ' ', remove(p, e.name))
        return h('li', { 'data-path': p },
          h('button', { type: 'button', class: 'link', onclick: async () => {
            try {
              const blob = await fetchFile(p)
              preview.textContent = await blob.slice(0, 65536).text()
            } catch (err) { showError(err) }
          } }, e.name), ' ', h('span', { class: 'muted' }, fmtBytes(e.size)), ' ',
          h('button', { type: 'button', onclick: async () => {
            try {
              const url = URL.createObjectURL(await fetchFile(p))
              const a = h('a', { href: url, download: e.name })
              document.body.append(a); a.click(); a.remove()
              setTimeout(() => URL.revokeObjectURL(url), 10000)
            } catch (err) { showError(err) }
          } }, 'Download'), ' ', remove(p, e.name))
      }))
      if (!entries.length) list.append(h('li', { class: 'muted' }, 'Empty directory.'))
    } catch (err) { showError(err) }
  }
  await open('/')
  return {
    title: `Volume ${v.name}`,
    el: h('section', { 'aria-labelledby': 'title', class: 'files' }, h('p', {}, h('a', { href: '#/volumes' }, '← Volumes')),
      h('h1', { id: 'title' }, `Volume ${v.name}`), h('p', { class: 'meta' }, v.volumeID), where,
      h('p', {}, h('label', { for: 'vol-upload' }, 'Upload', upload)), list,
      h('h2', {}, 'Preview'), preview),
  }
}
