import { describe, test, expect, beforeAll } from 'vitest'
import { createHash } from 'node:crypto'
import { Sandbox, CommandExitError, TimeoutError } from 'e2b'

let sbx
beforeAll(async () => {
  sbx = await Sandbox.create()
})

describe('commands', () => {
  test('run returns stdout, stderr and the exit code', async () => {
    const r = await sbx.commands.run('echo out; echo err >&2')
    expect(r.exitCode).toBe(0)
    expect(r.stdout).toBe('out\n')
    expect(r.stderr).toBe('err\n')
  })

  test('a non-zero exit throws CommandExitError', async () => {
    const err = await sbx.commands.run('echo bad >&2; exit 3').catch((e) => e)
    expect(err).toBeInstanceOf(CommandExitError)
    expect(err.exitCode).toBe(3)
    expect(err.stderr).toBe('bad\n')
    expect(err.error).toContain('exit status 3')
  })

  test('background, wait and kill', async () => {
    const done = await sbx.commands.run('sleep 0.2; echo finished', { background: true })
    expect(done.pid).toBeGreaterThan(0)
    const r = await done.wait()
    expect(r.stdout).toBe('finished\n')

    const long = await sbx.commands.run('sleep 30', { background: true })
    expect(await long.kill()).toBe(true)
    const err = await long.wait().catch((e) => e)
    expect(err).toBeInstanceOf(CommandExitError)
    expect(err.exitCode).toBe(-1)
    expect(await sbx.commands.kill(long.pid)).toBe(false)
  })

  test('sendStdin and closeStdin', async () => {
    const h = await sbx.commands.run('cat', { background: true, stdin: true })
    await sbx.commands.sendStdin(h.pid, 'hello ')
    await h.sendStdin('stdin\n')
    await sbx.commands.closeStdin(h.pid)
    const r = await h.wait()
    expect(r.stdout).toBe('hello stdin\n')
  })

  test('list shows running processes with their config', async () => {
    const h = await sbx.commands.run('sleep 30', { background: true })
    const procs = await sbx.commands.list()
    const p = procs.find((x) => x.pid === h.pid)
    expect(p).toBeDefined()
    expect(p.cmd).toBe('/bin/bash')
    expect(p.args).toContain('sleep 30')
    await h.kill()
  })

  test('connect attaches to a running process', async () => {
    const h = await sbx.commands.run('sleep 0.5; echo late', { background: true })
    await h.disconnect()
    let seen = ''
    const again = await sbx.commands.connect(h.pid, { onStdout: (d) => { seen += d } })
    const r = await again.wait()
    expect(r.stdout).toBe('late\n')
    expect(seen).toBe('late\n')
  })

  test('envs, cwd and user', async () => {
    const envs = await sbx.commands.run('echo $FOO', { envs: { FOO: 'bar' } })
    expect(envs.stdout).toBe('bar\n')
    const cwd = await sbx.commands.run('pwd', { cwd: '/tmp' })
    expect(cwd.stdout).toBe('/tmp\n')
    const def = await sbx.commands.run('whoami; pwd')
    expect(def.stdout).toBe('user\n/home/user\n')
    const root = await sbx.commands.run('whoami', { user: 'root' })
    expect(root.stdout).toBe('root\n')
  })

  test('timeoutMs kills the command', async () => {
    const started = Date.now()
    const err = await sbx.commands.run('sleep 10; echo never', { timeoutMs: 500 }).catch((e) => e)
    expect(err).toBeInstanceOf(TimeoutError)
    expect(Date.now() - started).toBeLessThan(5000)
    const procs = await sbx.commands.list()
    expect(procs.some((p) => p.args.includes('sleep 10; echo never'))).toBe(false)
  })

  test('5 MiB of output arrives intact', async () => {
    const size = 5 * 1024 * 1024
    const r = await sbx.commands.run(`head -c ${size} /dev/zero | tr '\\0' 'x'`)
    expect(r.stdout.length).toBe(size)
    const want = createHash('sha256').update('x'.repeat(size)).digest('hex')
    expect(createHash('sha256').update(r.stdout).digest('hex')).toBe(want)
  })

  test('20 concurrent commands', async () => {
    const results = await Promise.all(
      Array.from({ length: 20 }, (_, i) => sbx.commands.run(`sleep 0.1; echo ${i}`)),
    )
    results.forEach((r, i) => expect(r.stdout).toBe(`${i}\n`))
  })
})
