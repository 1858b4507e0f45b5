// Templates (list, delete) and one template's tags and builds with their logs,
// which follow a running build.
import { api } from './api.js'
import { h, fmtTime, showError } from './dom.js'

export async function templatesPage() {
  const body = h('tbody')
  async function load() {
    const list = await api.get('/templates')
    body.replaceChildren(...list.map((t) => h('tr', { 'data-id': t.templateID },
      h('td', {}, h('a', { href: `#/templates/${encodeURIComponent(t.templateID)}` }, t.templateID)),
      h('td', {}, (t.names || t.aliases || []).join(', ')),
      h('td', {}, t.buildStatus), h('td', { class: 'opt' }, `${t.cpuCount} CPU, ${t.memoryMB} MiB`),
      h('td', { class: 'opt' }, fmtTime(t.updatedAt)), h('td', {}, t.public ? 'public' : 'team'),
      h('td', {}, h('button', { type: 'button', class: 'danger', onclick: async () => {
        if (!confirm(`Delete template ${t.templateID}?`)) return
        try { await api.del(`/templates/${encodeURIComponent(t.templateID)}`); await load() } catch (err) { showError(err) }
      } }, 'Delete')))))
    if (!list.length) body.replaceChildren(h('tr', {}, h('td', { colspan: 7, class: 'muted' }, 'No templates of your team.')))
  }
  await load()
  return {
    title: 'Templates',
    el: h('section', { 'aria-labelledby': 'title' }, h('h1', { id: 'title' }, 'Templates'),
      h('div', { class: 'table-wrap' }, h('table', { id: 'templates' },
        h('thead', {}, h('tr', {}, ...['Template', 'Names', 'Status', 'Size', 'Updated', 'Visibility', ''].map((c, i) => h('th', { scope: 'col', class: i === 3 || i === 4 ? 'opt' : undefined }, c)))),
        body))),
  }
}

export async function templatePage(id) {
  const [t, tags] = await Promise.all([api.get(`/templates/${encodeURIComponent(id)}`), api.get(`/templates/${encodeURIComponent(id)}/tags`)])
  const tagRows = (tags || []).map((g) => h('tr', { 'data-tag': g.tag }, h('td', {}, g.tag), h('td', { class: 'meta' }, g.buildID), h('td', { class: 'opt' }, fmtTime(g.createdAt))))
  const logs = h('pre', { class: 'logs', id: 'build-logs', tabindex: 0, 'aria-label': 'Build logs' }, 'Choose a build.')
  let timer = null
  let stopped = false
  async function follow(buildID, offset = 0, shown = []) {
    clearTimeout(timer)
    try {
      const b = await api.get(`/templates/${encodeURIComponent(id)}/builds/${encodeURIComponent(buildID)}/status?logsOffset=${offset}`)
      const entries = b.logEntries || []
      shown.push(...entries.map((e) => `${e.timestamp} ${e.level} ${e.message}`))
      logs.textContent = `build ${buildID}: ${b.status}${b.reason ? ' — ' + (b.reason.message || '') : ''}\n` + shown.join('\n')
      logs.dataset.build = buildID
      logs.dataset.lines = String(shown.length)
      if (b.status === 'building' || b.status === 'waiting') {
        if (!stopped) timer = setTimeout(() => follow(buildID, offset + entries.length, shown), 1000)
      }
    } catch (err) { showError(err) }
  }
  const builds = (t.builds || []).slice().sort((a, b) => new Date(b.createdAt) - new Date(a.createdAt))
  const rows = builds.map((b) => h('tr', { 'data-build': b.buildID },
    h('td', {}, b.buildID), h('td', {}, b.status), h('td', { class: 'opt' }, fmtTime(b.createdAt)), h('td', { class: 'opt' }, fmtTime(b.finishedAt)),
    h('td', {}, h('button', { type: 'button', class: 'show-logs', onclick: () => follow(b.buildID) }, 'Logs'))))
  if (builds.length) setTimeout(() => follow(builds[0].buildID), 0)
  return {
    title: `Template ${id}`,
    el: h('section', { 'aria-labelledby': 'title' }, h('p', {}, h('a', { href: '#/templates' }, '← Templates')),
      h('h1', { id: 'title' }, `Template ${id}`),
      h('p', {}, `Names: ${(t.names || t.aliases || []).join(', ') || '—'} · ${t.public ? 'public' : 'team only'}`),
      h('h2', {}, 'Tags'),
      h('div', { class: 'table-wrap' }, h('table', { id: 'tags' },
        h('thead', {}, h('tr', {}, ...['Tag', 'Build', 'Tagged'].map((c, i) => h('th', { scope: 'col', class: i === 2 ? 'opt' : undefined }, c)))),
        h('tbody', {}, tagRows.length ? tagRows : h('tr', {}, h('td', { colspan: 3, class: 'muted' }, 'No tags.'))))),
      h('h2', {}, 'Builds'),
      h('div', { class: 'table-wrap' }, h('table', { id: 'builds' },
        h('thead', {}, h('tr', {}, ...['Build', 'Status', 'Started', 'Finished', ''].map((c, i) => h('th', { scope: 'col', class: i === 2 || i === 3 ? 'opt' : undefined }, c)))),
        h('tbody', {}, rows))),
      h('h2', {}, 'Build logs'), logs),
    cleanup: () => { stopped = true; clearTimeout(timer) },
  }
}
