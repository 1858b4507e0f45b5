// Killing (or pausing) a sandbox ends its streams through the proxy at
// once: a command's output stream, a watch, a WebSocket. They used to hang
// until the client's own deadline, since a gone sandbox never closes its
// connections. The SDK sees the connection dropped, finds the sandbox
// gone (its health check gets the proxy's 502) and reports a TimeoutError
// saying the sandbox was killed.
import { describe, expect, inject, test } from 'vitest'
import net from 'node:net'
import { Sandbox, TimeoutError } from 'e2b'

const w = inject('warren')

// settles gives what p settles with, or fails once ms have passed: what
// a kill ends must end now, not at some deadline of the client's.
function settles(p, what, ms = 20_000) {
  let timer
  const late = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} was still open ${ms} ms after the sandbox ended`)), ms)
  })
  return Promise.race([p.then((v) => ({ value: v }), (e) => ({ error: e })), late]).finally(() => clearTimeout(timer))
}

// started runs cmd in the foreground with neither a command nor a
// request deadline, and resolves once its first output arrived.
function startStream(sbx, cmd) {
  let first
  const firstOutput = new Promise((r) => { first = r })
  const done = sbx.commands.run(cmd, { timeoutMs: 0, requestTimeoutMs: 0, onStdout: () => first() })
  done.catch(() => {})
  return { firstOutput, done }
}

const killedMessage = 'The sandbox was killed or reached its end of life'

describe('kill ends every stream of the sandbox', () => {
  test("a command's output stream, a background command's wait and a watch", async () => {
    const sbx = await Sandbox.create()
    const other = await Sandbox.create()
    try {
      const fg = startStream(sbx, 'echo started; sleep 300; echo never')
      await fg.firstOutput
      const bg = await sbx.commands.run('sleep 300', { background: true, timeoutMs: 0 })
      const bgWait = bg.wait()
      bgWait.catch(() => {})
      let watchEnded
      const watchExit = new Promise((r) => { watchEnded = r })
      await sbx.files.watchDir('/tmp', () => {}, { timeoutMs: 0, onExit: (err) => watchEnded(err ?? 'ended') })
      // Another sandbox's stream must not be touched.
      const otherStream = startStream(other, 'echo started; sleep 300')
      await otherStream.firstOutput

      expect(await Sandbox.kill(sbx.sandboxId)).toBe(true)

      const fgEnd = await settles(fg.done, "the command's output stream")
      expect(fgEnd.error).toBeInstanceOf(TimeoutError)
      expect(fgEnd.error.message).toContain(killedMessage)
      const bgEnd = await settles(bgWait, "the background command's wait")
      expect(bgEnd.error).toBeInstanceOf(TimeoutError)
      expect((await settles(watchExit, 'the watch')).value).toBeTruthy()

      expect((await other.commands.run('echo still here')).stdout).toBe('still here\n')
      const racing = await Promise.race([otherStream.done.then(() => 'ended', () => 'ended'), new Promise((r) => setTimeout(() => r('open'), 500))])
      expect(racing).toBe('open')
    } finally {
      await Sandbox.kill(sbx.sandboxId).catch(() => {})
      await other.kill().catch(() => {})
    }
  })

  test('a WebSocket through the proxy is closed', async () => {
    const sbx = await Sandbox.create()
    try {
      // A server that accepts an upgrade and echoes what follows.
      await sbx.commands.run(`python3 -c '
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", 8000)); s.listen(1)
c, _ = s.accept(); c.recv(65536)
c.sendall(b"HTTP/1.1 101 Switching Protocols\\r\\nUpgrade: websocket\\r\\nConnection: Upgrade\\r\\n\\r\\n")
while True:
    d = c.recv(65536)
    if not d: break
    c.sendall(d)'`, { background: true })
      const proxy = new URL(w.sandboxUrl)
      let sock
      let answer = ''
      for (let i = 0; i < 50 && !answer.startsWith('HTTP/1.1 101'); i++) {
        sock = net.connect(Number(proxy.port), proxy.hostname)
        sock.write(`GET /ws HTTP/1.1\r\nHost: ${sbx.getHost(8000)}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n`)
        answer = await new Promise((r) => { sock.once('data', (d) => r(d.toString())); sock.once('close', () => r('')) })
        if (!answer.startsWith('HTTP/1.1 101')) { sock.destroy(); await new Promise((r) => setTimeout(r, 200)) }
      }
      expect(answer).toMatch(/^HTTP\/1\.1 101/)
      sock.write('ping')
      expect(await new Promise((r) => sock.once('data', (d) => r(d.toString())))).toBe('ping')
      const closed = new Promise((r) => sock.once('close', () => r('closed')))

      expect(await Sandbox.kill(sbx.sandboxId)).toBe(true)
      expect((await settles(closed, 'the WebSocket')).value).toBe('closed')
    } finally {
      await Sandbox.kill(sbx.sandboxId).catch(() => {})
    }
  })

  test('a pause on timeout ends the streams too', async () => {
    // autoPause: the reaper pauses it when its 5 s are up.
    const sbx = await Sandbox.create({ timeoutMs: 5_000, lifecycle: { onTimeout: 'pause' } })
    try {
      const fg = startStream(sbx, 'echo started; sleep 300')
      await fg.firstOutput
      const end = await settles(fg.done, "the paused sandbox's stream", 30_000)
      expect(end.error).toBeInstanceOf(TimeoutError)
      expect((await Sandbox.getInfo(sbx.sandboxId)).state).toBe('paused')
    } finally {
      await Sandbox.kill(sbx.sandboxId).catch(() => {})
    }
  })
})
