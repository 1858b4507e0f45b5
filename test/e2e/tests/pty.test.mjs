import { describe, test, expect, beforeAll } from 'vitest'
import { Sandbox, CommandExitError } from 'e2b'

let sbx
beforeAll(async () => {
  sbx = await Sandbox.create()
})

// waitFor polls cond until it holds (bounded).
async function waitFor(cond, ms = 5000) {
  const deadline = Date.now() + ms
  while (!(await cond())) {
    if (Date.now() > deadline) throw new Error('condition not met in time')
    await new Promise((r) => setTimeout(r, 20))
  }
}

const enc = new TextEncoder()

// terminal opens a PTY and collects everything it prints as text.
async function terminal(opts = {}) {
  const t = { out: '' }
  const dec = new TextDecoder()
  t.handle = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { t.out += dec.decode(d, { stream: true }) }, ...opts })
  t.type = (line) => sbx.pty.sendInput(t.handle.pid, enc.encode(line + '\n'))
  return t
}

describe('pty', () => {
  test('create, input, resize, kill', async () => {
    const t = await terminal()
    expect(t.handle.pid).toBeGreaterThan(0)

    // $((40+2)) keeps the echoed command line from matching the output.
    await t.type('echo pty-$((40+2))')
    await waitFor(() => t.out.includes('pty-42'))

    await t.type('stty size')
    await waitFor(() => t.out.includes('24 80'))

    await sbx.pty.resize(t.handle.pid, { cols: 120, rows: 40 })
    await t.type('stty size')
    await waitFor(() => t.out.includes('40 120'))

    await t.type('sleep 9.201')
    expect(await sbx.pty.kill(t.handle.pid)).toBe(true)
    await t.handle.wait().catch(() => {})
    const procs = await sbx.commands.list()
    expect(procs.some((p) => p.pid === t.handle.pid)).toBe(false)
    await waitFor(async () => (await sbx.commands.run("pgrep -f 'sleep 9[.]201' || true", { user: 'root' })).stdout === '')
    expect(await sbx.pty.kill(t.handle.pid)).toBe(false)
  })

  test('an interactive login shell as the default user, with a terminal environment', async () => {
    const t = await terminal({ envs: { PTY_VAR: 'set' } })
    await t.type('echo "<$(whoami)|$(pwd)|$TERM|$PTY_VAR|$([ -t 0 ] && echo tty)>"')
    await waitFor(() => t.out.includes('<user|/home/user|xterm-256color|set|tty>'))
    await sbx.pty.kill(t.handle.pid)
  })

  test('the shell\'s exit code reaches wait()', async () => {
    const t = await terminal()
    await t.type('exit 7')
    const err = await t.handle.wait().catch((e) => e)
    expect(err).toBeInstanceOf(CommandExitError)
    expect(err.exitCode).toBe(7)
  })
})
