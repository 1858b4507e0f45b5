// The official E2B CLI (npm @e2b/cli, pinned in package.json) as Warren's
// command line: it reads E2B_API_URL, E2B_SANDBOX_URL, E2B_DOMAIN and
// E2B_API_KEY (no login, no access token: every command it runs here takes
// the API key), and drives the same API the SDK does.
import { afterAll, beforeAll, describe, expect, inject, test } from 'vitest'
import { spawn } from 'node:child_process'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import os from 'node:os'
import path from 'node:path'
import { Sandbox } from 'e2b'

const cliPackage = createRequire(import.meta.url).resolve('@e2b/cli/package.json')
const cliBin = path.join(path.dirname(cliPackage), 'dist', 'index.js')
const w = inject('warren')
// A home of its own: the CLI must not find a login of whoever runs this.
const home = mkdtempSync(path.join(os.tmpdir(), 'warren-e2e-cli-'))
afterAll(() => rmSync(home, { recursive: true, force: true }))

// e2b runs the CLI with Warren's settings and returns its exit code and
// output; it never waits longer than timeoutMs.
function e2b(args, { cwd, timeoutMs = 60_000 } = {}) {
  return new Promise((resolve, reject) => {
    const env = {
      PATH: process.env.PATH, HOME: home, NO_COLOR: '1', FORCE_COLOR: '0',
      E2B_API_URL: w.apiUrl, E2B_SANDBOX_URL: w.sandboxUrl, E2B_DOMAIN: 'localhost', E2B_API_KEY: w.apiKey,
    }
    const p = spawn(process.execPath, [cliBin, ...args], { env, cwd, stdio: ['ignore', 'pipe', 'pipe'] })
    let stdout = ''
    let stderr = ''
    p.stdout.on('data', (d) => { stdout += d })
    p.stderr.on('data', (d) => { stderr += d })
    const timer = setTimeout(() => { p.kill('SIGKILL'); reject(new Error(`e2b ${args.join(' ')} ran longer than ${timeoutMs} ms\n${stdout}\n${stderr}`)) }, timeoutMs)
    p.on('close', (code) => { clearTimeout(timer); resolve({ code, stdout, stderr }) })
  })
}

// ok runs the CLI and expects exit code 0.
async function ok(args, opts) {
  const r = await e2b(args, opts)
  expect(r.code, `e2b ${args.join(' ')}\n${r.stdout}\n${r.stderr}`).toBe(0)
  return r
}

describe('e2b sandbox', () => {
  let sbx
  const tag = `cli-${Date.now()}`
  beforeAll(async () => {
    sbx = await Sandbox.create({ metadata: { suite: tag } })
  })
  afterAll(async () => {
    await sbx?.kill().catch(() => {})
  })

  test('list and info', async () => {
    const list = JSON.parse((await ok(['sandbox', 'list', '--metadata', `suite=${tag}`, '--format', 'json'])).stdout)
    expect(list.map((s) => s.sandboxId)).toEqual([sbx.sandboxId])
    expect(list[0].state).toBe('running')
    expect(list[0].metadata).toEqual({ suite: tag })

    const pretty = await ok(['sandbox', 'list'])
    expect(pretty.stdout).toContain(sbx.sandboxId)

    const info = JSON.parse((await ok(['sandbox', 'info', sbx.sandboxId, '--format', 'json'])).stdout)
    expect(info.sandboxId).toBe(sbx.sandboxId)
    expect(info.state).toBe('running')
    expect(info.templateId).toBe('base')
    expect(info.metadata).toEqual({ suite: tag })

    const missing = await e2b(['sandbox', 'info', 'nosuchsandbox0000000'])
    expect(missing.code).toBe(1)
    expect(missing.stderr).toContain("wasn't found")
  })

  test('exec: output, exit code, user, working directory, environment', async () => {
    let r = await ok(['sandbox', 'exec', sbx.sandboxId, 'echo', 'hello from $(hostname)'])
    expect(r.stdout).toMatch(/^hello from \S+\n$/)
    r = await e2b(['sandbox', 'exec', sbx.sandboxId, 'sh', '-c', 'echo out; echo err >&2; exit 3'])
    expect(r.code).toBe(3)
    expect(r.stdout).toBe('out\n')
    expect(r.stderr).toContain('err\n')
    r = await ok(['sandbox', 'exec', '-u', 'root', '-c', '/tmp', '-e', 'WHO=cli', sbx.sandboxId, 'echo $(whoami) $(pwd) $WHO'])
    expect(r.stdout).toBe('root /tmp cli\n')
  })

  test('logs', async () => {
    await sbx.commands.run('echo logged-by-cli-test')
    const r = await ok(['sandbox', 'logs', sbx.sandboxId, '--format', 'json'])
    const lines = r.stdout.trim().split('\n').filter((l) => l.startsWith('{')).map((l) => JSON.parse(l))
    expect(lines.length).toBeGreaterThan(0)
    expect(lines.some((l) => JSON.stringify(l).includes('logged-by-cli-test'))).toBe(true)
    expect(lines.every((l) => l.level && l.timestamp)).toBe(true)
  })

  test('metrics', async () => {
    // Metrics are sampled every 5 s: wait (bounded) for the first.
    let metrics = []
    for (let i = 0; i < 20 && metrics.length === 0; i++) {
      const r = await ok(['sandbox', 'metrics', sbx.sandboxId, '--format', 'json'])
      metrics = r.stdout.trim().split('\n').filter((l) => l.startsWith('{')).map((l) => JSON.parse(l))
      if (metrics.length === 0) await new Promise((res) => setTimeout(res, 1000))
    }
    expect(metrics.length).toBeGreaterThan(0)
    const m = metrics[0]
    expect(m.cpuCount).toBeGreaterThan(0)
    expect(m.memTotal).toBeGreaterThan(0)
    expect(m.diskTotal).toBeGreaterThan(0)
  })

  test('kill', async () => {
    const other = await Sandbox.create({ metadata: { suite: `${tag}-kill` } })
    const r = await ok(['sandbox', 'kill', other.sandboxId])
    expect(r.stdout).toContain('has been killed')
    expect(await other.isRunning()).toBe(false)
    const again = await e2b(['sandbox', 'kill', other.sandboxId])
    expect(again.stderr).toContain("wasn't found")
    const list = JSON.parse((await ok(['sandbox', 'list', '--metadata', `suite=${tag}-kill`, '--format', 'json'])).stdout)
    expect(list).toEqual([])
  })
})

// Pause and resume are issue 13's endpoints: this case passes once they
// are served.
describe('e2b sandbox pause and resume', () => {
  test('pause, list paused, resume, exec', async () => {
    const sbx = await Sandbox.create({ metadata: { suite: 'cli-pause' } })
    try {
      await sbx.commands.run('echo kept > /tmp/kept')
      let r = await ok(['sandbox', 'pause', sbx.sandboxId])
      expect(r.stdout).toContain('has been paused')
      const paused = JSON.parse((await ok(['sandbox', 'list', '--state', 'paused', '--metadata', 'suite=cli-pause', '--format', 'json'])).stdout)
      expect(paused.map((s) => s.sandboxId)).toEqual([sbx.sandboxId])
      const info = JSON.parse((await ok(['sandbox', 'info', sbx.sandboxId, '--format', 'json'])).stdout)
      expect(info.state).toBe('paused')
      r = await ok(['sandbox', 'resume', sbx.sandboxId])
      expect(r.stdout).toContain('has been resumed')
      r = await ok(['sandbox', 'exec', sbx.sandboxId, 'cat', '/tmp/kept'])
      expect(r.stdout).toBe('kept\n')
    } finally {
      await Sandbox.kill(sbx.sandboxId).catch(() => {})
    }
  })
})

describe('e2b template', () => {
  const name = `cli-tpl-${Date.now()}`
  let dir
  beforeAll(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'warren-e2e-cli-tpl-'))
    writeFileSync(path.join(dir, 'greeting.txt'), 'hello from the context\n')
    writeFileSync(path.join(dir, 'Dockerfile'), [
      'FROM e2bdev/base',
      'ENV MODE=cli',
      'RUN echo "built $MODE" > /home/user/built.txt',
      'COPY greeting.txt /home/user/greeting.txt',
      'WORKDIR /home/user',
      '',
    ].join('\n'))
  })
  afterAll(() => rmSync(dir, { recursive: true, force: true }))

  test('create from a Dockerfile, then list', async () => {
    const r = await ok(['template', 'create', name, '--path', dir, '--cpu-count', '1', '--memory-mb', '512'], { timeoutMs: 300_000 })
    expect(r.stdout).toContain('Building sandbox template')
    const sbx = await Sandbox.create(name)
    try {
      expect(await sbx.files.read('/home/user/built.txt')).toBe('built cli\n')
      expect(await sbx.files.read('/home/user/greeting.txt')).toBe('hello from the context\n')
    } finally {
      await sbx.kill()
    }
    const list = JSON.parse((await ok(['template', 'list', '--format', 'json'])).stdout)
    const mine = list.find((t) => (t.aliases ?? []).includes(name) || (t.names ?? []).some((n) => n.startsWith(name)))
    expect(mine, JSON.stringify(list)).toBeTruthy()
    expect(mine.cpuCount).toBe(1)
    expect(mine.memoryMB).toBe(512)
    expect((await ok(['template', 'list'])).stdout).toContain(name)
  }, 360_000)
})
