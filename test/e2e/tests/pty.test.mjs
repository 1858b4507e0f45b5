import { describe, test, expect, beforeAll } from 'vitest'
import { Sandbox } from 'e2b'

let sbx
beforeAll(async () => {
  sbx = await Sandbox.create()
})

// waitFor polls cond until it holds (bounded).
async function waitFor(cond, ms = 5000) {
  const deadline = Date.now() + ms
  while (!cond()) {
    if (Date.now() > deadline) throw new Error('condition not met in time')
    await new Promise((r) => setTimeout(r, 20))
  }
}

describe('pty', () => {
  test('create, input, resize, kill', async () => {
    let out = ''
    const dec = new TextDecoder()
    const h = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { out += dec.decode(d) } })
    expect(h.pid).toBeGreaterThan(0)

    await sbx.pty.sendInput(h.pid, new TextEncoder().encode('echo pty-$((40+2))\n'))
    await waitFor(() => out.includes('pty-42'))

    await sbx.pty.sendInput(h.pid, new TextEncoder().encode('stty size\n'))
    await waitFor(() => out.includes('24 80'))

    await sbx.pty.resize(h.pid, { cols: 120, rows: 40 })
    await sbx.pty.sendInput(h.pid, new TextEncoder().encode('stty size\n'))
    await waitFor(() => out.includes('40 120'))

    expect(await sbx.pty.kill(h.pid)).toBe(true)
    await h.wait().catch(() => {})
    const procs = await sbx.commands.list()
    expect(procs.some((p) => p.pid === h.pid)).toBe(false)
  })
})
