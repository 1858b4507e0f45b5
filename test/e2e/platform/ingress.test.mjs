// HTTPS sandbox URLs: with E2B_SANDBOX_URL unset, the SDK reaches envd at
// https://49983-{id}.localhost and users reach a port at
// https://{sandbox.getHost(port)}, on 443, as against E2B. The server's
// HTTPS proxy listens on a loopback address of its own and its leaves are
// signed by its local CA, which this process trusts through
// NODE_EXTRA_CA_CERTS (setup/warren.mjs); *.localhost resolves to that
// address (setup/platform-env.mjs). E2B's own tests for allowPublicTraffic
// and maskRequestHost do the same fetches.
import { afterAll, beforeAll, describe, expect, inject, test } from 'vitest'
import tls from 'node:tls'
import { Sandbox } from 'e2b'

const w = inject('warren')
let saved
beforeAll(() => {
  saved = process.env.E2B_SANDBOX_URL
  delete process.env.E2B_SANDBOX_URL
})
afterAll(() => {
  process.env.E2B_SANDBOX_URL = saved
})

// A server that answers every GET with the Host it was sent.
const hostEcho = `python3 -c '
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        b = self.headers["Host"].encode()
        self.send_response(200); self.send_header("Content-Length", str(len(b))); self.end_headers(); self.wfile.write(b)
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("0.0.0.0", 8000), H).serve_forever()'`

// waitFor fetches url until it answers other than 502 (the port not open
// yet), for at most 20 s.
async function waitFor(url, init) {
  const deadline = Date.now() + 20_000
  for (;;) {
    const res = await fetch(url, init)
    if (res.status !== 502 || Date.now() > deadline) return res
    await res.arrayBuffer()
    await new Promise((r) => setTimeout(r, 200))
  }
}

// peerCertificate does a TLS handshake with the HTTPS proxy for a server
// name and returns the certificate it is shown (or the error).
function peerCertificate(servername) {
  return new Promise((resolve) => {
    const s = tls.connect({ host: w.tlsHost, port: 443, servername, rejectUnauthorized: false }, () => {
      const cert = s.getPeerCertificate(true)
      s.end()
      resolve(cert)
    })
    s.on('error', (err) => resolve(err))
  })
}

describe('HTTPS sandbox URLs', () => {
  test('the trust and the resolution are in place', () => {
    expect(process.env.NODE_EXTRA_CA_CERTS).toBe(w.caFile)
    expect(process.env.E2B_SANDBOX_URL).toBeUndefined()
  })

  test("the SDK's envd calls go over HTTPS to 49983-{id}.localhost", async () => {
    const sbx = await Sandbox.create()
    try {
      expect(sbx.envdApiUrl).toBe(`https://${sbx.getHost(49983)}`)
      expect((await sbx.commands.run('echo over tls')).stdout).toBe('over tls\n')
      await sbx.files.write('tls.txt', 'written over tls')
      expect(await sbx.files.read('tls.txt')).toBe('written over tls')
      // A stream (command output) through the TLS proxy.
      const chunks = []
      await sbx.commands.run('for i in 1 2 3; do echo $i; sleep 0.2; done', { onStdout: (d) => chunks.push(d) })
      expect(chunks.join('')).toBe('1\n2\n3\n')
    } finally {
      await sbx.kill()
    }
  })

  test('getHost(8000) over HTTPS reaches a server in the sandbox', async () => {
    const sbx = await Sandbox.create()
    try {
      await sbx.files.write('/home/user/www/index.html', 'served over https')
      await sbx.commands.run('cd /home/user/www && python3 -m http.server 8000', { background: true })
      const res = await waitFor(`https://${sbx.getHost(8000)}/index.html`)
      expect(res.status).toBe(200)
      expect(await res.text()).toBe('served over https')
      // A closed port is E2B's 502, over HTTPS as over HTTP.
      const closed = await fetch(`https://${sbx.getHost(8001)}/`)
      expect(closed.status).toBe(502)
      expect(await closed.json()).toMatchObject({ code: 502, port: 8001, sandboxId: sbx.sandboxId })
    } finally {
      await sbx.kill()
    }
    // A killed sandbox is E2B's 502 too.
    const gone = await fetch(`https://${sbx.getHost(8000)}/`)
    expect(gone.status).toBe(502)
    expect(await gone.json()).toMatchObject({ code: 502, message: 'The sandbox was not found' })
  })

  test('allowPublicTraffic: false: 403 without the traffic token, 200 with it (E2B\'s test)', async () => {
    const sbx = await Sandbox.create({ network: { allowPublicTraffic: false } })
    try {
      expect(sbx.trafficAccessToken).toBeTruthy()
      // envd's port is not guarded by it: the SDK still works.
      await sbx.commands.run('python3 -m http.server 8000', { background: true })
      const url = `https://${sbx.getHost(8000)}`
      const withToken = await waitFor(url, { headers: { 'e2b-traffic-access-token': sbx.trafficAccessToken } })
      expect(withToken.status).toBe(200)
      const without = await fetch(url)
      expect(without.status).toBe(403)
      const wrong = await fetch(url, { headers: { 'e2b-traffic-access-token': 'not-the-token' } })
      expect(wrong.status).toBe(403)
    } finally {
      await sbx.kill()
    }
  })

  test('allowPublicTraffic: true needs no token', async () => {
    const sbx = await Sandbox.create({ network: { allowPublicTraffic: true } })
    try {
      await sbx.commands.run('python3 -m http.server 8000', { background: true })
      expect((await waitFor(`https://${sbx.getHost(8000)}`)).status).toBe(200)
    } finally {
      await sbx.kill()
    }
  })

  test('maskRequestHost replaces the Host the sandbox sees, ${PORT} filled in', async () => {
    const sbx = await Sandbox.create({ network: { maskRequestHost: 'app.example:${PORT}' } })
    try {
      await sbx.commands.run(hostEcho, { background: true })
      const res = await waitFor(`https://${sbx.getHost(8000)}/`)
      expect(await res.text()).toBe('app.example:8000')
      // Through the plain proxy the same.
      const plain = await fetch(`${w.sandboxUrl}/`, { headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '8000' } })
      expect(await plain.text()).toBe('app.example:8000')
    } finally {
      await sbx.kill()
    }
    const unmasked = await Sandbox.create()
    try {
      await unmasked.commands.run(hostEcho, { background: true })
      const res = await waitFor(`https://${unmasked.getHost(8000)}/`)
      expect(await res.text()).toBe(unmasked.getHost(8000))
    } finally {
      await unmasked.kill()
    }
  })

  test('certificates: one per sandbox host, signed by the local CA, none outside the domain', async () => {
    const cert = await peerCertificate('8000-abcdef.localhost')
    expect(cert.subjectaltname).toBe('DNS:8000-abcdef.localhost')
    expect(cert.issuer.CN).toMatch(/^Warren local CA for \*\.localhost/)
    for (const name of ['example.com', 'a.b.localhost']) {
      const err = await peerCertificate(name)
      expect(err, name).toBeInstanceOf(Error)
    }
  })
})
