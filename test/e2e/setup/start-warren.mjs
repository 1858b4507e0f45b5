import { spawn, spawnSync } from 'node:child_process'
import { existsSync, mkdtempSync, mkdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs'
import { fileURLToPath } from 'node:url'
import net from 'node:net'
import os from 'node:os'
import path from 'node:path'

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..')
export const warrenBinary = process.env.WARREN_BINARY || path.join(repo, 'bin', 'warren')
// `make setup` installs runsc and builds the base template here.
const installed = process.env.WARREN_SETUP_DIR || '/var/lib/warren'

// freePort asks the kernel for a free loopback port.
export async function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer()
    srv.once('error', reject)
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address()
      srv.close(() => resolve(port))
    })
  })
}

// newDataDir makes a temporary data directory that shares the installed
// runtime and the base template's layers (read-only use) but has its own
// store, credentials, sandboxes, and templates: what its builds make stays
// in it and goes with it. codeInterpreter: false leaves out
// code-interpreter-v1 (a data dir whose server has yet to build it).
export function newDataDir(at, { codeInterpreter = true } = {}) {
  for (const p of ['bin/runsc', 'layers', 'templates/base.json']) {
    if (!existsSync(path.join(installed, p))) {
      throw new Error(`${installed}/${p} is missing: run \`make setup\` first`)
    }
  }
  // A fixed path (at) gives a fixed derived run dir, where runsc keeps a
  // mount, rather than one per run.
  let dir
  if (at) {
    rmSync(at, { recursive: true, force: true })
    mkdirSync(at, { mode: 0o700 })
    dir = at
  } else {
    dir = mkdtempSync(path.join(os.tmpdir(), 'warren-e2e-'))
  }
  for (const d of ['bin', 'layers', 'templates']) mkdirSync(path.join(dir, d))
  symlinkSync(path.join(installed, 'bin', 'runsc'), path.join(dir, 'bin', 'runsc'))
  // The built-in templates `warren setup` made: base, and
  // code-interpreter-v1 when it was built.
  for (const name of codeInterpreter ? ['base.json', 'code-interpreter-v1.json'] : ['base.json']) {
    const file = path.join(installed, 'templates', name)
    if (name !== 'base.json' && !existsSync(file)) continue
    // Without the start snapshot a server on the installed dir may have
    // recorded (its checkpoint image is not shared): this server takes
    // its own.
    const t = JSON.parse(readFileSync(file, 'utf8'))
    if (t.snapshot) {
      t.layers = t.layers.filter((l) => l !== t.snapshot)
      delete t.snapshot
      delete t.snapshotToken
    }
    for (const layer of t.layers) {
      const link = path.join(dir, 'layers', layer)
      if (!existsSync(link)) symlinkSync(path.join(installed, 'layers', layer), link)
    }
    writeFileSync(path.join(dir, 'templates', name), JSON.stringify(t, null, 2))
  }
  return dir
}

// startWarren runs `warren serve` on free loopback ports, in its own
// data dir, run dir, cgroup and network range (instance picks them, so
// that several can run at once and beside a `make run`; with derived,
// the server derives them from its data dir), and waits until GET /health
// answers 200. tlsAddr adds the HTTPS proxy there. It returns the SDK's
// settings and stop().
export async function startWarren({ dataDir = newDataDir(), instance = 'e2e', net16 = 126, derived = false, tlsAddr, poolSize = 1, ciSnapshot = false, extraArgs = [], timeoutMs = 60_000, apiPort, proxyPort } = {}) {
  if (!existsSync(warrenBinary)) throw new Error(`${warrenBinary} is missing: run \`make build\` first`)
  // Fixed ports only where a client was built against them (E2B's
  // dashboard bakes its API URLs in at build time).
  apiPort ??= await freePort()
  proxyPort ??= await freePort()
  const args = [
    'serve', '--data-dir', dataDir,
    '--api-addr', `127.0.0.1:${apiPort}`, '--proxy-addr', `127.0.0.1:${proxyPort}`,
    // runsc keeps a mount in its state dir: a fixed one per instance, not
    // one per temporary data dir.
    ...(derived ? [] : [
      '--run-dir', `/run/warren-${instance}`, '--cgroup-parent', `/warren-${instance}`,
      '--network-prefix', `w${instance}`, '--network-cidr', `10.${net16}.0.0/16`]),
    ...(tlsAddr ? ['--proxy-tls-addr', tlsAddr] : []),
    // The tests and benches read the log's key=value lines.
    '--log-format', 'text',
    // The code interpreter's start snapshot boots and checkpoints a sandbox
    // beside the test's own: only the servers that test it take it.
    `--code-interpreter-snapshot=${ciSnapshot}`,
    '--pool-size', String(poolSize), ...extraArgs,
  ]
  const env = { ...process.env }
  delete env.WARREN_API_KEY
  delete env.WARREN_ACCESS_TOKEN
  const apiUrl = `http://127.0.0.1:${apiPort}`
  const { proc, output, stop } = await spawnWarren(args, { env, healthUrl: `${apiUrl}/health`, timeoutMs })
  const creds = Object.fromEntries(readFileSync(path.join(dataDir, 'credentials'), 'utf8')
    .trim().split('\n').map((l) => l.split('=')))
  // The CA is made before the server answers /health.
  const caFile = path.join(dataDir, 'ingress', 'localhost', 'ca.pem')
  return {
    dataDir,
    caFile: tlsAddr && existsSync(caFile) ? caFile : undefined,
    pid: proc.pid,
    apiUrl,
    sandboxUrl: `http://127.0.0.1:${proxyPort}`,
    proxyPort,
    apiKey: creds.E2B_API_KEY,
    accessToken: creds.E2B_ACCESS_TOKEN,
    output,
    // stop ends warren with SIGTERM (sandboxes keep running) and, with
    // removeDataDir, removes its data dir.
    async stop({ removeDataDir = false } = {}) {
      await stop()
      if (removeDataDir) {
        unmountBelow(dataDir)
        rmSync(dataDir, { recursive: true, force: true })
      }
    },
  }
}

// spawnWarren runs the warren binary with args and env and waits until
// healthUrl answers 200 (GET). It returns the process, its output so far
// (output()), and stop(), which ends it with SIGTERM (SIGKILL after 15 s).
export async function spawnWarren(args, { env = process.env, healthUrl, timeoutMs = 60_000 }) {
  const proc = spawn(warrenBinary, args, { env, stdio: ['ignore', 'pipe', 'pipe'] })
  let output = ''
  const keep = (d) => {
    output += d
    if (process.env.WARREN_E2E_VERBOSE) process.stderr.write(d)
  }
  proc.stdout.on('data', keep)
  proc.stderr.on('data', keep)
  let exited = null
  const gone = new Promise((r) => proc.once('exit', (code, signal) => { exited = { code, signal }; r() }))
  const reap = () => proc.kill('SIGKILL')
  process.once('exit', reap)
  const deadline = Date.now() + timeoutMs
  for (;;) {
    if (exited) throw new Error(`warren ${args[0]} exited during start: ${JSON.stringify(exited)}\n${output}`)
    try {
      const res = await fetch(healthUrl, { signal: AbortSignal.timeout(1000) })
      if (res.status === 200) break
    } catch {}
    if (Date.now() > deadline) {
      proc.kill('SIGKILL')
      throw new Error(`warren ${args[0]} did not answer ${healthUrl} within ${timeoutMs} ms\n${output}`)
    }
    await new Promise((r) => setTimeout(r, 50))
  }
  return {
    proc,
    output: () => output,
    exited: () => exited,
    async stop(signal = 'SIGTERM') {
      process.off('exit', reap)
      if (!exited) {
        proc.kill(signal)
        const timer = setTimeout(() => proc.kill('SIGKILL'), 15_000)
        await gone
        clearTimeout(timer)
      }
    },
  }
}

// killAll kills every sandbox the server lists, so that nothing outlives a test run.
export async function killAll(w) {
  const headers = { 'X-API-Key': w.apiKey }
  const res = await fetch(`${w.apiUrl}/v2/sandboxes?limit=100`, { headers })
  if (!res.ok) return
  for (const sb of await res.json()) {
    await fetch(`${w.apiUrl}/sandboxes/${sb.sandboxID}`, { method: 'DELETE', headers })
  }
}

// unmountBelow unmounts what the server left mounted below dir (team
// volumes' file systems stay mounted when it stops, for its next start),
// deepest first, so that the directory can be removed.
export function unmountBelow(dir) {
  const unescape = (p) => p.replace(/\\([0-7]{3})/g, (_, o) => String.fromCharCode(parseInt(o, 8)))
  const points = readFileSync('/proc/self/mountinfo', 'utf8').split('\n')
    .map((l) => unescape(l.split(' ')[4] || ''))
    .filter((m) => m === dir || m.startsWith(dir + '/'))
    .sort((a, b) => b.length - a.length)
  for (const m of points) spawnSync('umount', ['-l', m])
}
