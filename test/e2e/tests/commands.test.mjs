import { describe, test, expect, beforeAll } from 'vitest'
import { createHash } from 'node:crypto'
import {
  Sandbox, CommandExitError, TimeoutError, InvalidArgumentError, AuthenticationError, NotFoundError,
} from 'e2b'

let sbx
beforeAll(async () => {
  sbx = await Sandbox.create()
})

// alive reports whether a process whose command line matches the regex
// exists, as seen by the OS (not envd's own table). The regex must not match
// itself literally (write `sleep 9[.]1`), or the wrapping bash would count.
async function alive(regex) {
  const r = await sbx.commands.run(`pgrep -f '${regex}' || true`, { user: 'root' })
  return r.stdout.trim() !== ''
}

// gone waits (bounded) until check() reports false, else fails the test.
async function gone(check, ms = 2000) {
  const deadline = Date.now() + ms
  while (await check()) {
    if (Date.now() > deadline) throw new Error(`still there after ${ms} ms: ${check}`)
    await new Promise((r) => setTimeout(r, 50))
  }
}

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

  test('background, wait and kill (the whole process tree)', async () => {
    const done = await sbx.commands.run('sleep 0.2; echo finished', { background: true })
    expect(done.pid).toBeGreaterThan(0)
    const r = await done.wait()
    expect(r.stdout).toBe('finished\n')

    const long = await sbx.commands.run('sleep 9.101; echo never', { background: true })
    expect(await alive('sleep 9[.]101')).toBe(true)
    expect(await long.kill()).toBe(true)
    const err = await long.wait().catch((e) => e)
    expect(err).toBeInstanceOf(CommandExitError)
    expect(err.exitCode).toBe(-1)
    expect(await sbx.commands.kill(long.pid)).toBe(false)
    await gone(() => alive('sleep 9[.]101'))
  })

  test('sendStdin and closeStdin', async () => {
    const h = await sbx.commands.run('cat', { background: true, stdin: true })
    await sbx.commands.sendStdin(h.pid, 'hello ')
    await h.sendStdin('stdin\n')
    await sbx.commands.closeStdin(h.pid)
    const r = await h.wait()
    expect(r.stdout).toBe('hello stdin\n')
  })

  test('4 MiB through stdin', async () => {
    const h = await sbx.commands.run('sha256sum', { background: true, stdin: true })
    const chunk = 'y'.repeat(1 << 20)
    for (let i = 0; i < 4; i++) await h.sendStdin(chunk)
    await h.closeStdin()
    const want = createHash('sha256').update(chunk.repeat(4)).digest('hex')
    expect((await h.wait()).stdout.split(' ')[0]).toBe(want)
  })

  test('list shows running processes with their config', async () => {
    const h = await sbx.commands.run('sleep 30', { background: true, envs: { LISTED: '1' }, cwd: '/tmp' })
    const procs = await sbx.commands.list()
    const p = procs.find((x) => x.pid === h.pid)
    expect(p).toBeDefined()
    expect(p.cmd).toBe('/bin/bash')
    expect(p.args).toEqual(['-l', '-c', 'sleep 30'])
    expect(p.envs).toEqual({ LISTED: '1' })
    expect(p.cwd).toBe('/tmp')
    await h.kill()
  })

  test('connect attaches to a running process; every stream gets the output', async () => {
    const h = await sbx.commands.run('sleep 0.5; echo late', { background: true })
    let seen = ''
    const again = await sbx.commands.connect(h.pid, { onStdout: (d) => { seen += d } })
    const [first, second] = await Promise.all([h.wait(), again.wait()])
    expect(first.stdout).toBe('late\n')
    expect(second.stdout).toBe('late\n')
    expect(seen).toBe('late\n')
  })

  test('a disconnected process keeps running and can be reconnected', async () => {
    const h = await sbx.commands.run('sleep 0.5; echo after', { background: true })
    await h.disconnect()
    const again = await sbx.commands.connect(h.pid)
    expect((await again.wait()).stdout).toBe('after\n')
  })

  test('envs, cwd and user', async () => {
    const envs = await sbx.commands.run('echo $FOO', { envs: { FOO: 'bar' } })
    expect(envs.stdout).toBe('bar\n')
    const cwd = await sbx.commands.run('pwd', { cwd: '/tmp' })
    expect(cwd.stdout).toBe('/tmp\n')
    const def = await sbx.commands.run('whoami; pwd; echo $HOME $USER')
    expect(def.stdout).toBe('user\n/home/user\n/home/user user\n')
    const root = await sbx.commands.run('whoami; pwd; echo $HOME $USER', { user: 'root' })
    expect(root.stdout).toBe('root\n/root\n/root root\n')
  })

  test('timeoutMs kills the command', async () => {
    const started = Date.now()
    const err = await sbx.commands.run('sleep 9.102; echo never', { timeoutMs: 500 }).catch((e) => e)
    expect(err).toBeInstanceOf(TimeoutError)
    expect(Date.now() - started).toBeLessThan(5000)
    // The SDK's own timer fires the TimeoutError; envd's deadline for the
    // process runs from when it got the request, a moment later.
    await gone(async () => (await sbx.commands.list()).some((p) => p.args.includes('sleep 9.102; echo never')))
    await gone(() => alive('sleep 9[.]102'))
  })

  test('timeoutMs of a background command holds after the client disconnects', async () => {
    const h = await sbx.commands.run('sleep 9.103', { background: true, timeoutMs: 500 })
    await h.disconnect()
    await new Promise((r) => setTimeout(r, 1000))
    expect((await sbx.commands.list()).some((p) => p.pid === h.pid)).toBe(false)
    expect(await alive('sleep 9[.]103')).toBe(false)
  })

  test('5 MiB of output arrives intact', async () => {
    const size = 5 * 1024 * 1024
    // Random bytes, base64 so the output is text: 3.75 MiB encode to exactly 5 MiB.
    const file = `/tmp/e2e-out-${Date.now()}`
    await sbx.commands.run(`head -c ${(size / 4) * 3} /dev/urandom | base64 -w0 > ${file}`)
    const r = await sbx.commands.run(`cat ${file}`)
    const inside = await sbx.commands.run(`sha256sum < ${file} && rm ${file}`)
    expect(r.stdout.length).toBe(size)
    expect(createHash('sha256').update(r.stdout).digest('hex')).toBe(inside.stdout.split(' ')[0])
  })

  test('multi-byte UTF-8 output is decoded across chunk boundaries', async () => {
    const r = await sbx.commands.run(`for i in $(seq 200); do printf 'é€😀%.0s' $(seq 500); done`)
    expect(r.stdout).toBe('é€😀'.repeat(100_000))
  })

  test('20 concurrent commands', async () => {
    const results = await Promise.all(
      Array.from({ length: 20 }, (_, i) => sbx.commands.run(`sleep 0.1; echo ${i}`)),
    )
    results.forEach((r, i) => expect(r.stdout).toBe(`${i}\n`))
  })

  test('errors map to the SDK classes', async () => {
    await expect(sbx.commands.run('true', { cwd: '/nonexistent-dir' })).rejects.toBeInstanceOf(InvalidArgumentError)
    await expect(sbx.commands.run('true', { user: 'no-such-user' })).rejects.toBeInstanceOf(AuthenticationError)
    await expect(sbx.commands.sendStdin(999_999, 'x')).rejects.toBeInstanceOf(NotFoundError)
    await expect(sbx.commands.connect(999_999)).rejects.toBeInstanceOf(NotFoundError)
    expect(await sbx.commands.kill(999_999)).toBe(false)
  })
})
