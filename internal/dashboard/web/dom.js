// h builds DOM elements; text is always set as text (never as HTML), so
// what sandboxes and tenants name things cannot inject markup.
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag)
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v)
    else if (k === 'text') el.textContent = v
    else el.setAttribute(k, v === true ? '' : String(v))
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue
    el.append(c instanceof Node ? c : document.createTextNode(String(c)))
  }
  return el
}

export function fmtTime(s) {
  if (!s) return ''
  const d = new Date(s)
  return isNaN(d) ? String(s) : d.toLocaleString()
}

export function fmtBytes(n) {
  if (n == null) return ''
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB']
  let i = 0
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++ }
  return `${n.toFixed(i ? 1 : 0)} ${u[i]}`
}

// showError shows the API's message in the page's alert box (null hides it).
export function showError(err) {
  const box = document.getElementById('error')
  if (!err) { box.hidden = true; box.textContent = ''; return }
  box.textContent = err.message || String(err)
  box.hidden = false
}

// waitVisible calls fn once the page is visible again: a hidden tab
// makes no periodic calls.
export function waitVisible(fn) {
  const on = () => { if (!document.hidden) { document.removeEventListener('visibilitychange', on); fn() } }
  document.addEventListener('visibilitychange', on)
}
