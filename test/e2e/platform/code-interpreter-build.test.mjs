// `make run` serves before code-interpreter-v1 is built: `warren serve
// --build-code-interpreter` builds it in the background. Meanwhile base
// is served at once and a create of code-interpreter-v1 gets a 503 that
// says it is being built (not a hang); a stop mid-build leaves nothing
// half-made and the next start builds again; once it is ready, cells run.
//
// Tests reach no outside host, and the build's apt-get would: here the
// build is that of another process on the same data dir (as a `warren
// setup` beside the server), which holds the template's lock file while
// the server's build waits on it, and then provides the layer (the one
// `make setup` built) when it lets go.
import { spawn } from 'node:child_process'
import { existsSync, readFileSync, readdirSync, symlinkSync } from 'node:fs'
import path from 'node:path'
import { afterAll, expect, test } from 'vitest'
import { Sandbox as BaseSandbox } from 'e2b'
import { Sandbox } from '@e2b/code-interpreter'
import { killAll, newDataDir, startWarren, unmountBelow } from '../setup/start-warren.mjs'

const installed = process.env.WARREN_SETUP_DIR || '/var/lib/warren'
const ci = 'code-interpreter-v1'
let own
let holder
const dataDir = newDataDir(undefined, { codeInterpreter: false })

afterAll(async () => {
  holder?.release()
  if (own) {
    await killAll(own).catch(() => {})
    await own.stop()
  }
  unmountBelow(dataDir)
  const { rmSync } = await import('node:fs')
  rmSync(dataDir, { recursive: true, force: true })
})

const start = () => startWarren({ dataDir, instance: 'cib', net16: 158, poolSize: 0, extraArgs: ['--build-code-interpreter'] })

// holdLock takes the template's build lock as a concurrent builder would,
// and resolves once it holds it.
async function holdLock() {
  const lock = path.join(dataDir, `.${ci}.lock`)
  // In a process group of its own, which release() kills: its sleep
  // would hold the lock's file descriptor on.
  const p = spawn('flock', ['--exclusive', lock, 'sh', '-c', 'echo locked; exec sleep 600'], { stdio: ['ignore', 'pipe', 'inherit'], detached: true })
  p.release = () => { try { process.kill(-p.pid, 'SIGKILL') } catch {} }
  await new Promise((resolve, reject) => {
    p.stdout.once('data', resolve)
    p.once('exit', (code) => reject(new Error(`flock exited ${code}`)))
  })
  return p
}

async function createRaw(w, templateID) {
  const res = await fetch(`${w.apiUrl}/sandboxes`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', 'X-API-Key': w.apiKey },
    body: JSON.stringify({ templateID, timeout: 60 }),
    // A create that waited for the build would end here, and fail.
    signal: AbortSignal.timeout(15_000),
  })
  return { status: res.status, body: await res.json() }
}

const opts = () => ({ apiUrl: own.apiUrl, sandboxUrl: own.sandboxUrl, apiKey: own.apiKey })

function mountsBelow(dir) {
  return readFileSync('/proc/self/mountinfo', 'utf8').split('\n')
    .map((l) => l.split(' ')[4] || '').filter((m) => m === dir || m.startsWith(dir + '/'))
}

const leftovers = () => readdirSync(path.join(dataDir, 'layers')).filter((n) => n.startsWith('.build-'))

test('base at once, code-interpreter-v1 a 503 while it builds; a stop mid-build leaves nothing; the next start builds it and cells run', async () => {
  const installedCI = path.join(installed, 'templates', `${ci}.json`)
  if (!existsSync(installedCI)) throw new Error(`${installedCI} is missing: run \`make setup\` first`)
  const ciLayer = JSON.parse(readFileSync(installedCI, 'utf8')).layers.at(-1)

  holder = await holdLock()
  own = await start()
  expect(own.output()).toContain('building a built-in template in the background')
  expect(own.output()).toContain('The code-interpreter-v1 template (@e2b/code-interpreter\'s default) is being built in the background')

  const base = await BaseSandbox.create('base', opts())
  expect((await base.commands.run('echo served')).stdout).toBe('served\n')
  await base.kill()

  const refused = await createRaw(own, ci)
  expect(refused.status).toBe(503)
  expect(refused.body.code).toBe(503)
  expect(refused.body.message).toMatch(/code-interpreter-v1 template is being built on this node/)
  await expect(Sandbox.create(opts())).rejects.toThrow(/being built/)

  // Stopped mid-build: the server ends, and leaves no build dir, overlay
  // or template behind.
  await own.stop()
  expect(own.output()).toMatch(/build stopped with the server/)
  expect(mountsBelow(dataDir)).toEqual([])
  expect(leftovers()).toEqual([])
  expect(existsSync(path.join(dataDir, 'templates', `${ci}.json`))).toBe(false)

  // The next start builds it again; the other builder finishes.
  own = await start()
  expect((await createRaw(own, ci)).status).toBe(503)
  symlinkSync(path.join(installed, 'layers', ciLayer), path.join(dataDir, 'layers', ciLayer))
  holder.release()
  holder = undefined

  let created
  for (let i = 0; i < 60 && !created; i++) {
    const r = await createRaw(own, ci)
    if (r.status === 201) created = r.body
    else {
      expect(r.status).toBe(503)
      await new Promise((res) => setTimeout(res, 500))
    }
  }
  expect(created, 'code-interpreter-v1 became ready').toBeDefined()
  await fetch(`${own.apiUrl}/sandboxes/${created.sandboxID}`, { method: 'DELETE', headers: { 'X-API-Key': own.apiKey } })
  expect(own.output()).toMatch(/built-in template ready/)

  const sbx = await Sandbox.create({ ...opts(), timeoutMs: 120_000 })
  try {
    expect((await sbx.runCode('x = 20; x * 2 + 2')).text).toBe('42')
  } finally {
    await sbx.kill()
  }
}, 300_000)
