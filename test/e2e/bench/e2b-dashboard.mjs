// Runs E2B's own open-source dashboard (github.com/e2b-dev/dashboard, its
// API-key mode) against a real `warren serve` on loopback and drives it
// once in Debian's headless Chromium: a wrong key is refused, the key
// signs in, the sandbox list shows a sandbox the SDK made, its monitoring,
// logs, file browser (a file the SDK wrote) and terminal (a command whose
// effect the SDK then reads) work, a template the SDK built shows on the
// template, tag, build and build-log pages, a tag assigned in its dialog
// lands on the build picked, and its pause and kill buttons
// pause and kill the sandbox. Screenshots of each page go to
// the output directory.
//
// Not in `make test` or `make bench`: it installs and builds a Next.js app
// (minutes on two cores). Reproduce with a checkout of the dashboard
// (its source is not vendored here):
//
//   git clone https://github.com/e2b-dev/dashboard /tmp/e2b-dashboard   # or any copy of it
//   cd test/e2e && flock /tmp/warren-test.lock node bench/e2b-dashboard.mjs /tmp/e2b-dashboard [--out DIR]
//
// The checkout's dependencies are installed with bun (from the npm
// registry, pinned by the checkout's bun.lock) unless node_modules is
// there; it is built (`next build`) unless the build there was made for
// the same URLs. Google Fonts, which `next build` fetches, are replaced by
// a local font (NEXT_FONT_GOOGLE_MOCKED_RESPONSES), so nothing but the npm
// registry is reached. The dashboard's NEXT_PUBLIC_* URLs are baked in at
// build time, so Warren runs on fixed loopback ports (E2B_DASHBOARD_PORTS,
// "api,proxy,dashboard"; default 39411,39412,39413).
import { spawn, spawnSync } from 'node:child_process'
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { Sandbox, Template } from 'e2b'
import puppeteer from 'puppeteer-core'
import { startWarren, killAll } from '../setup/start-warren.mjs'

const args = process.argv.slice(2)
const checkout = args.find((a, i) => !a.startsWith('--') && args[i - 1] !== '--out')
if (!checkout || !existsSync(path.join(checkout, 'package.json')) ||
    JSON.parse(readFileSync(path.join(checkout, 'package.json'), 'utf8')).name !== '@e2b/dashboard') {
  console.error('usage: node bench/e2b-dashboard.mjs <checkout of github.com/e2b-dev/dashboard> [--out DIR]')
  process.exit(2)
}
const outIdx = args.indexOf('--out')
const out = outIdx >= 0 ? path.resolve(args[outIdx + 1]) : mkdtempSync(path.join(os.tmpdir(), 'e2b-dashboard-'))
mkdirSync(out, { recursive: true })
const [apiPort, proxyPort, dashPort] = (process.env.E2B_DASHBOARD_PORTS || '39411,39412,39413').split(',').map(Number)
const chromium = process.env.CHROMIUM || '/usr/bin/chromium'
const bunVersion = '1.2.23'

// The dashboard's settings: Warren's API for both of E2B's APIs (the
// dashboard-api below /dashboard-api), and its proxy for every sandbox.
const fontMock = path.join(out, 'google-fonts-offline.cjs')
writeFileSync(fontMock, `// Offline stand-in for Google Fonts' CSS: a local font for every family.
module.exports = new Proxy({}, { get: (_, url) => typeof url === 'string'
  ? "@font-face { font-family: 'offline'; font-style: normal; font-weight: 400; src: local('DejaVu Sans'); }\\n" : undefined })
`)
const dashEnv = {
  NEXT_PUBLIC_E2B_DOMAIN: 'localhost',
  NEXT_PUBLIC_INFRA_API_URL: `http://127.0.0.1:${apiPort}`,
  NEXT_PUBLIC_DASHBOARD_API_URL: `http://127.0.0.1:${apiPort}/dashboard-api`,
  NEXT_PUBLIC_E2B_SANDBOX_URL: `http://127.0.0.1:${proxyPort}`,
}
const env = { ...process.env, ...dashEnv, NEXT_TELEMETRY_DISABLED: '1', NEXT_FONT_GOOGLE_MOCKED_RESPONSES: fontMock }
delete env.E2B_API_KEY // the key form, not the pre-authenticated mode

function run(cmd, argv, what) {
  console.log(`# ${what}: ${cmd} ${argv.join(' ')}`)
  const t0 = Date.now()
  const r = spawnSync(cmd, argv, { cwd: checkout, env, stdio: 'inherit' })
  if (r.status !== 0) throw new Error(`${what} failed (${r.status ?? r.signal})`)
  console.log(`# ${what}: ${((Date.now() - t0) / 1000).toFixed(0)} s`)
}

if (!existsSync(path.join(checkout, 'node_modules', 'next'))) {
  run('npx', ['--yes', `bun@${bunVersion}`, 'install', '--frozen-lockfile'], 'install')
}
const stamp = path.join(checkout, '.next', 'warren-build-env.json')
if (!existsSync(path.join(checkout, '.next', 'BUILD_ID')) || !existsSync(stamp) || readFileSync(stamp, 'utf8') !== JSON.stringify(dashEnv)) {
  run(path.join(checkout, 'node_modules', '.bin', 'next'), ['build', '--webpack'], 'build')
  writeFileSync(stamp, JSON.stringify(dashEnv))
}

const results = []
function check(name, ok, detail = '') {
  results.push({ name, ok, detail })
  console.log(`${ok ? 'ok  ' : 'FAIL'} ${name}${detail ? ` (${detail})` : ''}`)
}

const w = await startWarren({ instance: 'e2bd', net16: 173, poolSize: 0, apiPort, proxyPort })
let next
let nextLog = ''
const browser = await puppeteer.launch({ executablePath: chromium, headless: true, args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'] })
try {
  next = spawn(path.join(checkout, 'node_modules', '.bin', 'next'), ['start', '-H', '127.0.0.1', '-p', String(dashPort)],
    { cwd: checkout, env, stdio: ['ignore', 'pipe', 'pipe'] })
  next.stdout.on('data', (d) => { nextLog += d })
  next.stderr.on('data', (d) => { nextLog += d })
  const dash = `http://127.0.0.1:${dashPort}`
  for (let deadline = Date.now() + 60_000; ;) {
    try {
      if ((await fetch(`${dash}/api/health`)).ok) break
    } catch {}
    if (Date.now() > deadline) throw new Error(`the dashboard did not answer ${dash}/api/health:\n${nextLog}`)
    await new Promise((r) => setTimeout(r, 250))
  }
  check('dashboard /api/health (calls dashboard-api /health)', true)

  const opts = { apiKey: w.apiKey, apiUrl: w.apiUrl, sandboxUrl: w.sandboxUrl }
  // A template of the team, for the template, tag and build pages (E2B's
  // dashboard-api): built from base with a step whose output is its log.
  const tplName = 'e2b-dashboard-check'
  const built = Template.build(Template().fromTemplate('base').runCmd('echo built-for-the-e2b-dashboard'), tplName,
    { ...opts, cpuCount: 1, memoryMB: 512 })
  const sbx = await Sandbox.create('base', { ...opts, metadata: { app: 'e2b-dashboard-check' }, timeoutMs: 600_000 })
  await sbx.files.write('/home/user/hello-from-sdk.txt', 'written by the SDK\n')
  // A few seconds of metrics for the charts.
  await sbx.commands.run('for i in 1 2 3; do echo log line $i; sleep 1; done')

  const page = await browser.newPage()
  await page.setViewport({ width: 1280, height: 800 })
  const failed = []
  page.on('response', (r) => { if (r.status() >= 400 && !r.url().includes('/_next/')) failed.push(`${r.status()} ${r.request().method()} ${r.url()}`) })
  page.on('pageerror', (e) => failed.push(`page error on ${page.url()}: ${e.message}`))
  page.on('console', (m) => { if (m.type() === 'error') failed.push(`console error on ${page.url()}: ${m.text().slice(0, 500)}`) })
  // Chromium aborts what is in flight when the host's addresses change
  // (net::ERR_NETWORK_CHANGED), which every sandbox's start or end does
  // (its veth). A page whose load was cut so is loaded once more, and the
  // check says so; any other failure is the check's.
  let networkChanged = 0
  page.on('requestfailed', (r) => { if (r.failure()?.errorText === 'net::ERR_NETWORK_CHANGED') networkChanged++ })
  async function visit(url, want) {
    for (let attempt = 0; ; attempt++) {
      const before = networkChanged
      await page.goto(url)
      try {
        await waitText(want, 45_000)
        return attempt ? 'loaded again after net::ERR_NETWORK_CHANGED' : ''
      } catch (e) {
        if (attempt || networkChanged === before) throw e
      }
    }
  }
  const shot = (name) => page.screenshot({ path: path.join(out, `${name}.png`), fullPage: false })
  const textOf = () => page.evaluate(() => document.body.innerText)
  // innerText as shown (the dashboard upper-cases some labels): compared in lower case.
  const waitText = (s, timeout = 30_000) => page.waitForFunction((t) => document.body.innerText.toLowerCase().includes(t.toLowerCase()), { timeout }, s)

  // A wrong key is refused with the dashboard's message.
  await page.goto(`${dash}/`)
  await page.waitForSelector('#api-key')
  await page.type('#api-key', 'e2b_' + '0'.repeat(40))
  await page.click('button[type=submit]')
  try {
    await waitText('Invalid API key', 15_000)
    check('a wrong key is refused', true)
  } catch {
    check('a wrong key is refused', false, (await textOf()).slice(0, 200))
  }
  await shot('sign-in-refused')

  // Sign in; the list shows the SDK's sandbox.
  await page.$eval('#api-key', (el) => { el.value = '' })
  await page.click('#api-key', { clickCount: 3 })
  await page.keyboard.press('Backspace')
  await page.type('#api-key', w.apiKey)
  await Promise.all([page.waitForNavigation({ timeout: 60_000 }).catch(() => {}), page.click('button[type=submit]')])
  try {
    await waitText(sbx.sandboxId, 60_000)
    check('sign in, the list shows the SDK\'s sandbox', true, page.url())
  } catch {
    check('sign in, the list shows the SDK\'s sandbox', false, `${page.url()}: ${(await textOf()).slice(0, 300)}`)
  }
  await new Promise((r) => setTimeout(r, 3000)) // the list's metrics (GET /sandboxes/metrics)
  await shot('sandboxes')

  // Open it: monitoring (its metrics), logs, file browser, terminal.
  const pages = [['monitoring', 'running for'], ['logs', 'log line'], ['filesystem', 'hello-from-sdk.txt']]
  for (const [tab, want] of pages) {
    try {
      check(`sandbox ${tab} shows "${want}"`, true, await visit(`${dash}/sandboxes/${sbx.sandboxId}/${tab}`, want))
    } catch {
      check(`sandbox ${tab} shows "${want}"`, false, (await textOf()).slice(0, 300))
    }
    await new Promise((r) => setTimeout(r, 2000))
    await shot(`sandbox-${tab}`)
  }
  // The file's content, read through envd from the browser.
  try {
    const [item] = await page.$$('xpath/.//*[normalize-space(text())="hello-from-sdk.txt"]')
    await item.click()
    await waitText('written by the SDK', 30_000)
    check('file browser opens the SDK\'s file', true)
  } catch (e) {
    check('file browser opens the SDK\'s file', false, e.message.slice(0, 200))
  }
  await shot('sandbox-filesystem-file')

  await page.goto(`${dash}/sandboxes/${sbx.sandboxId}/terminal`)
  let typed = false
  try {
    await page.waitForSelector('[aria-label="Terminal"]', { timeout: 30_000 })
    await new Promise((r) => setTimeout(r, 8000)) // connect, PTY
    await page.click('[aria-label="Terminal"]')
    await page.keyboard.type('echo typed-in-e2b-dashboard > /tmp/terminal-check\n')
    typed = true
  } catch (e) {
    check('terminal runs a command', false, e.message.slice(0, 200))
  }
  if (typed) {
    let got = ''
    for (let deadline = Date.now() + 20_000; Date.now() < deadline && !got.includes('typed'); ) {
      got = await sbx.files.read('/tmp/terminal-check').catch(() => '')
      await new Promise((r) => setTimeout(r, 500))
    }
    check('terminal runs a command (the SDK reads its effect)', got.trim() === 'typed-in-e2b-dashboard', JSON.stringify(got.trim()))
  }
  await shot('sandbox-terminal')

  // The template pages: the list, the template (overview, tags, builds),
  // all builds, and the build's page with its log.
  const info = await built
  const templatePages = [
    ['/templates/list', 'templates', tplName],
    [`/templates/${info.templateId}/overview`, 'template-overview', tplName],
    [`/templates/${info.templateId}/tags`, 'template-tags', 'default'],
    ['/templates/builds', 'builds', tplName],
    [`/templates/${info.templateId}/builds/${info.buildId}`, 'build-logs', 'built-for-the-e2b-dashboard'],
  ]
  for (const [route, name, want] of templatePages) {
    try {
      check(`${name} page shows "${want}"`, true, await visit(`${dash}${route}`, want))
    } catch {
      check(`${name} page shows "${want}"`, false, (await textOf()).replace(/\s+/g, ' ').slice(0, 300))
      if (name === 'templates') {
        const res = await fetch(`${w.apiUrl}/dashboard-api/templates?limit=50&sort=updated_at_desc`, { headers: { 'X-API-Key': w.apiKey } })
        console.log(`  GET /dashboard-api/templates: ${res.status} ${(await res.text()).slice(0, 2000)}`)
      }
    }
    await new Promise((r) => setTimeout(r, 1500))
    await shot(name)
  }

  // Assign a tag from the tags page: POST /templates/tags with the
  // target "name:buildID" (the build picked in the dialog).
  try {
    await visit(`${dash}/templates/${info.templateId}/tags`, 'default')
    const [assign] = await page.$$('xpath/.//button[contains(normalize-space(.), "Assign new tag")]')
    await assign.click()
    await page.waitForSelector('input[placeholder="Enter tag name"]', { timeout: 20_000 })
    await page.type('input[placeholder="Enter tag name"]', 'from-the-dashboard')
    await page.waitForSelector('[role="radio"]', { timeout: 20_000 })
    await page.click('[role="radio"]')
    await new Promise((r) => setTimeout(r, 2000)) // the name's check (tags/exists)
    const [submit] = await page.$$('xpath/.//button[normalize-space(.)="Assign"]')
    await submit.click()
    await waitText('assigned successfully', 30_000)
    const tags = await (await fetch(`${w.apiUrl}/templates/${info.templateId}/tags`, { headers: { 'X-API-Key': w.apiKey } })).json()
    check('assign a tag from the tags page', tags.some((t) => t.tag === 'from-the-dashboard' && t.buildID === info.buildId), JSON.stringify(tags))
  } catch (e) {
    check('assign a tag from the tags page', false, `${e.message.slice(0, 200)}: ${(await textOf()).replace(/\s+/g, ' ').slice(0, 300)}`)
  }
  await shot('template-tag-assigned')

  // Pause from the sandbox's header (the SDK sees it paused), resume it
  // with the SDK, and kill it from the header (the SDK sees it gone).
  await page.goto(`${dash}/sandboxes/${sbx.sandboxId}/monitoring`)
  try {
    await waitText('Pause', 30_000)
    const [pause] = await page.$$('xpath/.//button[normalize-space(.)="Pause"]')
    await pause.click()
    const [confirm] = await page.$$('xpath/.//button[normalize-space(.)="Pause Sandbox"]')
    await confirm.click()
    let state = ''
    for (let deadline = Date.now() + 60_000; Date.now() < deadline && state !== 'paused'; ) {
      state = (await Sandbox.getInfo(sbx.sandboxId, opts).catch(() => ({}))).state
      await new Promise((r) => setTimeout(r, 500))
    }
    check('pause button pauses the sandbox', state === 'paused', state)
    await page.reload()
    await new Promise((r) => setTimeout(r, 2000))
    await shot('sandbox-paused')
    await Sandbox.connect(sbx.sandboxId, opts)
  } catch (e) {
    check('pause button pauses the sandbox', false, e.message.slice(0, 200))
  }

  // Kill from the sandbox's header; the SDK sees it gone.
  await page.goto(`${dash}/sandboxes/${sbx.sandboxId}/monitoring`)
  try {
    await waitText('Kill', 30_000)
    const [kill] = await page.$$('xpath/.//button[normalize-space(.)="Kill"]')
    await kill.click()
    const [confirm] = await page.$$('xpath/.//button[normalize-space(.)="Kill Sandbox"]')
    await confirm.click()
    let running = true
    for (let deadline = Date.now() + 20_000; Date.now() < deadline && running; ) {
      running = await sbx.isRunning().catch(() => false)
      await new Promise((r) => setTimeout(r, 500))
    }
    check('kill button kills the sandbox', !running)
  } catch (e) {
    check('kill button kills the sandbox', false, e.message.slice(0, 200))
  }
  await shot('sandbox-killed')

  console.log(`\nrequests the browser saw fail (${failed.length}):`)
  for (const f of [...new Set(failed)].slice(0, 40)) console.log(`  ${f}`)
} finally {
  await browser.close()
  await killAll(w).catch(() => {})
  if (next) next.kill('SIGTERM')
  await w.stop()
  rmSync(w.dataDir, { recursive: true, force: true })
  writeFileSync(path.join(out, 'dashboard-server.log'), nextLog)
}
const bad = results.filter((r) => !r.ok)
console.log(`\n${results.length - bad.length}/${results.length} checks passed; screenshots and the dashboard's server log in ${out}`)
process.exit(bad.length ? 1 : 0)
