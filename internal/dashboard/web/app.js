// The dashboard: a hash router over a few pages, in plain ES modules.
import { session } from './api.js'
import { h, showError } from './dom.js'
import { sandboxesPage } from './sandboxes.js'
import { sandboxPage } from './sandbox.js'
import { templatesPage, templatePage } from './templates.js'
import { keysPage } from './keys.js'
import { secretsPage, volumesPage, volumePage } from './team.js'
import { webhooksPage, webhookPage } from './webhooks.js'
import { usagePage } from './usage.js'
import { nodesPage } from './nodes.js'

const main = document.getElementById('main')
const nav = document.getElementById('nav')
let cleanup = null
let signedIn = false
// admin: signed in with the admin token (the admin's listener): only
// the nodes page is theirs.
let admin = false

function setNav() {
  nav.hidden = false
  for (const a of nav.querySelectorAll('a')) a.hidden = admin !== (a.getAttribute('href') === '#/nodes')
}


function signInPage(message) {
  nav.hidden = true
  const input = h('input', { id: 'key', name: 'key', type: 'password', autocomplete: 'off', required: true, 'aria-describedby': 'key-help' })
  const msg = h('p', { id: 'signin-error', role: 'alert', class: 'muted' }, message || '')
  const form = h('form', { class: 'card', 'aria-labelledby': 'signin-title' },
    h('h1', { id: 'signin-title' }, 'Sign in to Warren'),
    h('label', { for: 'key' }, 'API key or access token', input),
    h('p', { id: 'key-help', class: 'muted' }, 'e2b_… or sk_e2b_…, as the SDK uses (on the admin listener, the admin token wadm_…). Kept by the server for this session; the page never stores it.'),
    h('button', { type: 'submit' }, 'Sign in'), msg)
  form.addEventListener('submit', async (e) => {
    e.preventDefault()
    msg.textContent = ''
    try {
      admin = !!(await session.signIn(input.value)).admin
      signedIn = true
      setNav()
      // The admin's only page is the nodes'; a team's are all the others.
      const home = admin ? '#/nodes' : '#/sandboxes'
      if (!location.hash || location.hash === '#/signin' || admin !== (location.hash === '#/nodes')) location.hash = home
      else route()
    } catch (err) {
      msg.textContent = err.message
      msg.className = 'error'
    }
  })
  main.replaceChildren(form)
  input.focus()
}

const routes = [
  [/^#\/sandboxes\/([a-z0-9]+)$/, (m) => sandboxPage(m[1])],
  [/^#\/sandboxes$/, () => sandboxesPage()],
  [/^#\/templates\/([^/]+)$/, (m) => templatePage(decodeURIComponent(m[1]))],
  [/^#\/templates$/, () => templatesPage()],
  [/^#\/keys$/, () => keysPage()],
  [/^#\/secrets$/, () => secretsPage()],
  [/^#\/volumes\/([^/]+)$/, (m) => volumePage(decodeURIComponent(m[1]))],
  [/^#\/volumes$/, () => volumesPage()],
  [/^#\/webhooks\/([^/]+)$/, (m) => webhookPage(decodeURIComponent(m[1]))],
  [/^#\/webhooks$/, () => webhooksPage()],
  [/^#\/usage$/, () => usagePage()],
  [/^#\/nodes$/, () => nodesPage()],
]

async function route() {
  if (cleanup) { cleanup(); cleanup = null }
  showError(null)
  if (!signedIn) return signInPage()
  const hash = location.hash || (admin ? '#/nodes' : '#/sandboxes')
  for (const a of nav.querySelectorAll('a')) {
    if (hash.startsWith(a.getAttribute('href'))) a.setAttribute('aria-current', 'page')
    else a.removeAttribute('aria-current')
  }
  for (const [re, page] of routes) {
    const m = hash.match(re)
    if (!m) continue
    main.replaceChildren(h('p', {}, 'Loading…'))
    try {
      const view = await page(m)
      main.replaceChildren(view.el)
      cleanup = view.cleanup || null
      document.title = `${view.title} · Warren`
      main.focus({ preventScroll: true })
    } catch (err) {
      main.replaceChildren(h('p', {}, 'This page could not be shown.'))
      showError(err)
    }
    return
  }
  main.replaceChildren(h('h1', {}, 'Not found'), h('p', {}, h('a', { href: '#/sandboxes' }, 'Sandboxes')))
}

window.addEventListener('warren:signedout', (e) => {
  if (!signedIn) return
  signedIn = false
  if (cleanup) { cleanup(); cleanup = null }
  signInPage(e.detail)
})
window.addEventListener('hashchange', route)
document.getElementById('signout').addEventListener('click', async () => {
  try { await session.signOut() } catch { /* gone already */ }
  signedIn = false
  signInPage('Signed out.')
})

try {
  admin = !!(await session.get()).admin
  signedIn = true
  setNav()
} catch { signedIn = false }
route()
