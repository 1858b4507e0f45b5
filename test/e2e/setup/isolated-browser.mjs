// launchIsolatedBrowser starts Debian's headless Chromium (puppeteer-core)
// in a network namespace of its own, where 127.0.0.1:PORT of each given
// port reaches the host's 127.0.0.1:PORT through a Unix socket.
//
// Why: Chromium aborts every request in flight (net::ERR_NETWORK_CHANGED,
// loopback included) whenever an interface of its namespace changes, and
// on a Warren host sandboxes' veths come and go all the time (this test's
// nodes', and any other server's on the machine). In a namespace of its
// own the browser sees only its loopback. Only the listed ports are
// reached, and only on loopback.
//
// The namespace is entered with nsenter --net, not `ip netns exec`, which
// also makes a mount namespace of its own: that copy of the host's mounts
// would hold sandboxes' disks mounted after the server unmounts them (a
// pause, then a resume, failed on it).
import { spawn, execFileSync } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { mkdtempSync, rmSync, writeFileSync, chmodSync } from 'node:fs'
import net from 'node:net'
import os from 'node:os'
import path from 'node:path'
import puppeteer from 'puppeteer-core'

// The forwarder run inside the namespace: 127.0.0.1:PORT → DIR/PORT.sock.
const inner = `
import net from 'node:net'
const [dir, ...ports] = process.argv.slice(2)
let ready = 0
for (const p of ports) {
  net.createServer((c) => {
    const u = net.connect(dir + '/' + p + '.sock')
    c.pipe(u).pipe(c)
    c.on('error', () => u.destroy())
    u.on('error', () => c.destroy())
  }).listen(Number(p), '127.0.0.1', () => { if (++ready === ports.length) console.log('ready') })
}
`

export async function launchIsolatedBrowser({ ports, chromium = '/usr/bin/chromium', name }) {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'warren-e2e-browser-'))
  const ns = name || `wbr${process.pid}-${randomBytes(3).toString('hex')}`
  const servers = []
  let fwd
  const close = async () => {
    fwd?.kill()
    for (const s of servers) s.close()
    try { execFileSync('ip', ['netns', 'del', ns], { stdio: 'ignore' }) } catch { /* gone */ }
    rmSync(dir, { recursive: true, force: true })
  }
  try {
    execFileSync('ip', ['netns', 'add', ns])
    execFileSync('ip', ['-n', ns, 'link', 'set', 'lo', 'up'])
    // Host side: DIR/PORT.sock → the host's 127.0.0.1:PORT.
    for (const p of ports) {
      const s = net.createServer((c) => {
        const t = net.connect(p, '127.0.0.1')
        c.pipe(t).pipe(c)
        c.on('error', () => t.destroy())
        t.on('error', () => c.destroy())
      })
      await new Promise((resolve, reject) => s.listen(path.join(dir, `${p}.sock`), resolve).on('error', reject))
      servers.push(s)
    }
    writeFileSync(path.join(dir, 'inner.mjs'), inner)
    fwd = spawn('nsenter', [`--net=/run/netns/${ns}`, process.execPath, path.join(dir, 'inner.mjs'), dir, ...ports.map(String)], { stdio: ['ignore', 'pipe', 'inherit'] })
    await new Promise((resolve, reject) => {
      fwd.stdout.on('data', (d) => d.toString().includes('ready') && resolve())
      fwd.on('exit', (code) => reject(new Error(`the namespace's forwarder exited (${code})`)))
    })
    // Chromium in the namespace, driven over a pipe (its debugging port
    // would be in the namespace).
    const wrapper = path.join(dir, 'chromium.sh')
    writeFileSync(wrapper, `#!/bin/sh\nexec nsenter --net=/run/netns/${ns} ${chromium} "$@"\n`)
    chmodSync(wrapper, 0o755)
    const browser = await puppeteer.launch({ executablePath: wrapper, pipe: true, headless: true,
      args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'] })
    return { browser, async close() { await browser.close().catch(() => {}); await close() } }
  } catch (e) {
    await close()
    throw e
  }
}
