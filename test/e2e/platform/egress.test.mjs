// Egress policies, secrets and credential injection (issue 14), through
// the official SDK against a real `warren serve` of this file's own (its
// resolver and the test CA are flags), with stand-in internet hosts in
// network namespaces (198.18.0.0/15): nothing leaves the machine.
import { readFile, writeFile } from 'node:fs/promises'
import crypto from 'node:crypto'
import { afterAll, afterEach, beforeAll, describe, expect, test } from 'vitest'
import { Sandbox, Secret } from 'e2b'
import { startWarren, killAll } from '../setup/start-warren.mjs'
import { startEgressHosts } from '../setup/egress-hosts.mjs'

let w, hosts
const opts = () => ({ apiUrl: w.apiUrl, sandboxUrl: w.sandboxUrl, apiKey: w.apiKey })
const sandboxes = []

beforeAll(async () => {
  hosts = await startEgressHosts({ prefix: 'e14' })
  w = await startWarren({ instance: 'egr', net16: 173, poolSize: 1, extraArgs: warrenArgs() })
  // The relying party on web1 trusts this Warren's identity keys.
  await writeFile(hosts.JWKSFile, `${w.apiUrl}/.well-known/jwks.json`)
}, 240_000)

// The private SOCKS5 host is the one private address this Warren lets
// sandboxes (and so egress proxies) reach.
const warrenArgs = () => ['--resolv-conf', hosts.ResolvConf, '--egress-ca-file', hosts.CAFile,
  '--allow-private-cidr', `${hosts.SocksPrivate}/32`]

afterAll(async () => {
  if (w) {
    await killAll(w).catch(() => {})
    const problems = w.output().split('\n').filter((l) => /level=(WARN|ERROR)/.test(l))
    if (problems.length) console.error(`warren serve's warnings:\n${problems.join('\n')}`)
    await w.stop({ removeDataDir: true })
  }
  if (hosts) await hosts.stop()
})

// Each test's sandboxes go with it: the machine has two cores.
afterEach(async () => {
  while (sandboxes.length) await sandboxes.pop().kill().catch(() => {})
})

async function create(o = {}) {
  const sbx = await Sandbox.create({ ...opts(), ...o })
  sandboxes.push(sbx)
  return sbx
}

// curl runs curl in the sandbox: its exit code (0 ok, 7 refused, 35/56
// reset during TLS or the exchange, 28 timed out) and its output.
async function curl(sbx, args) {
  try {
    const r = await sbx.commands.run(`curl -sS --max-time 10 ${args}`, { timeoutMs: 30_000 })
    return { code: 0, out: r.stdout }
  } catch (e) {
    if (e.exitCode === undefined) throw e
    return { code: e.exitCode, out: e.stdout ?? '', err: e.stderr ?? '' }
  }
}

// reaches and blocked: a blocked connection fails at once (refused or
// reset), never by the timeout.
async function reaches(sbx, args, server) {
  const r = await curl(sbx, args)
  expect(r.code, `curl ${args}: ${r.err}`).toBe(0)
  if (server) expect(r.out).toContain(`server=${server}`)
  return r.out
}
async function blocked(sbx, args) {
  const r = await curl(sbx, args)
  expect(r.code, `curl ${args} should fail fast, got ${r.code}: ${r.out}`).not.toBe(0)
  expect(r.code, `curl ${args} hung until its timeout`).not.toBe(28)
}

describe('address rules', () => {
  test('default egress works; allowInternetAccess: false blocks at once', async () => {
    const open = await create()
    await reaches(open, `http://${hosts.Web1}/`, 'web1')
    const closed = await create({ allowInternetAccess: false })
    await blocked(closed, `http://${hosts.Web1}/`)
    await blocked(closed, `-k https://${hosts.Web2}/`)
    // DNS keeps working.
    const dns = await closed.commands.run('getent hosts api.example.test')
    expect(dns.stdout).toContain(hosts.Web1)
    const info = await Sandbox.getInfo(closed.sandboxId, opts())
    expect(info.allowInternetAccess).toBe(false)
    expect(info.network.denyOut).toContain('0.0.0.0/0')
  })

  test('denyOut a range; allowOut wins over denyOut', async () => {
    const deny = await create({ network: { denyOut: ['198.18.11.0/24'] } })
    await reaches(deny, `http://${hosts.Web1}/`, 'web1')
    await blocked(deny, `http://${hosts.Web2}/`)
    const allow = await create({ network: { allowOut: [hosts.Web2], denyOut: ['198.18.0.0/15'] } })
    await reaches(allow, `http://${hosts.Web2}:8080/`, 'web2')
    await blocked(allow, `http://${hosts.Web1}/`)
    // UDP is judged by the address rules too (non-53 UDP): the allowed
    // host's echo answers, the denied one's never gets the datagram.
    const udp = (host) => allow.commands.run(`python3 -c "
import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(2)
s.connect(('${host}', 9999)); s.send(b'ping')
try:
    print(s.recv(10).decode())
except OSError as e:
    print(type(e).__name__)"`)
    expect((await udp(hosts.Web2)).stdout.trim()).toBe('ping')
    expect((await udp(hosts.Web1)).stdout.trim()).not.toBe('ping')
  })

  test('sandbox to sandbox stays blocked whatever is allowed', async () => {
    const a = await create()
    await a.commands.run('python3 -m http.server 8000', { background: true })
    const ip = (await a.commands.run("hostname -I | awk '{print $1}'")).stdout.trim()
    const b = await create({ network: { allowOut: ['0.0.0.0/0', '10.0.0.0/8'] } })
    await blocked(b, `http://${ip}:8000/`)
  })

  test('a policy of 1000 ranges and 100 domains', async () => {
    const cidrs = Array.from({ length: 1000 }, (_, i) => `203.0.${i >> 8}.${i & 255}/32`)
    const domains = Array.from({ length: 100 }, (_, i) => `d${i}.example.test`)
    const sbx = await create({ network: { allowOut: [...cidrs, ...domains, hosts.Web2], denyOut: ['0.0.0.0/0'] } })
    await reaches(sbx, 'http://d42.example.test/', 'web1')
    await reaches(sbx, `http://${hosts.Web2}/`, 'web2')
    await blocked(sbx, `http://${hosts.Web1}/`)
    const info = await Sandbox.getInfo(sbx.sandboxId, opts())
    expect(info.network.allowOut.length).toBe(1101)
  })
})

describe('domains', () => {
  test('by HTTP Host and TLS SNI on 80, 443, 8080 and 8443, with wildcards; the bare IP refused', async () => {
    const sbx = await create({ network: { allowOut: ['*.example.test'], denyOut: ['0.0.0.0/0'] } })
    // HTTPS to a host without rules is not intercepted: the sandbox
    // verifies the real host itself, with the test CA.
    await sbx.files.write('/tmp/test-ca.pem', await readFile(hosts.CAFile, 'utf8'))
    await reaches(sbx, '--cacert /tmp/test-ca.pem https://api.example.test/', 'web1')
    await reaches(sbx, '--cacert /tmp/test-ca.pem https://www.example.test:8443/', 'web1')
    await reaches(sbx, 'http://api.example.test/', 'web1')
    await reaches(sbx, 'http://www.example.test:8080/', 'web1')
    // The bare IP, a name not allowed, and the allowed name sent to
    // another address (it reaches the name's own address instead).
    await blocked(sbx, `http://${hosts.Web1}/`)
    await blocked(sbx, '-k https://other.test/')
    await blocked(sbx, 'http://other.test/')
    await reaches(sbx, `--resolve api.example.test:80:${hosts.Web2} http://api.example.test/`, 'web1')
    const logs = await (await fetch(`${w.apiUrl}/v2/sandboxes/${sbx.sandboxId}/logs?source=network`, { headers: { 'X-API-Key': w.apiKey } })).json()
    const entries = logs.logs.map((l) => l.fields)
    expect(entries.some((f) => f.decision === 'allow' && f.host === 'api.example.test' && f.proto === 'tls')).toBe(true)
    expect(entries.some((f) => f.decision === 'deny' && f.dst === `${hosts.Web1}:80`)).toBe(true)
    expect(entries.every((f) => f.source === 'network')).toBe(true)
  })

  test('updateNetwork both ways on a running sandbox, without a restart', async () => {
    const sbx = await create()
    await sbx.commands.run('sleep 600', { background: true })
    await reaches(sbx, `http://${hosts.Web1}/`, 'web1')
    await sbx.updateNetwork({ allowInternetAccess: false })
    await blocked(sbx, `http://${hosts.Web1}/`)
    await sbx.updateNetwork({ allowOut: ['api.example.test'], denyOut: ['0.0.0.0/0'] })
    await reaches(sbx, 'http://api.example.test/', 'web1')
    await blocked(sbx, `http://${hosts.Web2}/`)
    await sbx.updateNetwork({})
    await reaches(sbx, `http://${hosts.Web2}/`, 'web2')
    // Still the same sandbox: its process lives on.
    expect((await sbx.commands.run('pgrep -x sleep')).stdout.trim()).not.toBe('')
    await expect(Sandbox.updateNetwork('nosuchsandbox', {}, opts())).rejects.toThrow()
    await expect(sbx.updateNetwork({ denyOut: ['example.com'] })).rejects.toThrow(/example.com/)
  })
})

describe('secrets and rules', () => {
  test('secrets CRUD with versions; values never returned', async () => {
    const name = `e14-crud-${Date.now()}`
    const s = await Secret.create(name, 'first-value', { ...opts(), metadata: { env: 'test' } })
    expect(s.version).toBe(1)
    expect(s.metadata).toEqual({ env: 'test' })
    const s2 = await Secret.update(s.secretId, 'second-value', opts())
    expect(s2.version).toBe(2)
    expect((await Secret.getInfo(name, opts())).version).toBe(2)
    expect(await Secret.exists(name, opts())).toBe(true)
    const page = await Secret.list({ ...opts(), limit: 100 }).nextItems()
    expect(page.map((x) => x.name)).toContain(name)
    expect(JSON.stringify(page)).not.toContain('-value')
    expect(await Secret.destroy(s.secretId, opts())).toBe(true)
    expect(await Secret.exists(name, opts())).toBe(false)
    expect(await Secret.destroy(s.secretId, opts())).toBe(false)
  })

  test('a rule injects a secret over HTTP and HTTPS; the sandbox never sees it', async () => {
    const canary = `canary-${Math.random().toString(36).slice(2)}`
    const name = `e14-token-${Date.now()}`
    await Secret.create(name, canary, opts())
    const sbx = await create({
      network: {
        allowOut: ['api.example.test'], denyOut: ['0.0.0.0/0'],
        rules: { 'api.example.test': [{ transform: { headers: { Authorization: `Bearer ${Secret.fill(name)}` } } }] },
      },
    })
    const http = await reaches(sbx, '-H "Authorization: mine" http://api.example.test/', 'web1')
    expect(http).toContain(`Authorization: Bearer ${canary}`)
    // HTTPS: the node's CA is in the sandbox's trust store; no -k.
    const https = await reaches(sbx, 'https://api.example.test/', 'web1')
    expect(https).toContain(`Authorization: Bearer ${canary}`)
    const py = await sbx.commands.run(`python3 -c "import urllib.request; print(urllib.request.urlopen('https://api.example.test:8443/').read().decode())"`)
    expect(py.stdout).toContain(`Authorization: Bearer ${canary}`)
    const seen = await sbx.commands.run("env; cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' '\\n'; true")
    expect(seen.stdout).not.toContain(canary)
    const info = JSON.stringify(await Sandbox.getInfo(sbx.sandboxId, opts()))
    expect(info).not.toContain(canary)
    // A new version is used from the next request on.
    await Secret.update(name, `${canary}-v2`, opts())
    await new Promise((r) => setTimeout(r, 6000)) // past the proxy's cache on another node
    expect(await reaches(sbx, 'http://api.example.test/')).toContain(`Bearer ${canary}-v2`)
  })
})

describe('workload identity', () => {
  const audience = 'https://api.example.test' // what web1's verifier wants
  test('iam.tokens: a fresh JWT-SVID per request, verified against the JWKS by a relying party; the sandbox never holds one', async () => {
    // The keys are public: no credentials.
    const jwks = await (await fetch(`${w.apiUrl}/.well-known/jwks.json`)).json()
    expect(jwks.keys.length).toBeGreaterThan(0)
    expect(jwks.keys[0]).toMatchObject({ kty: 'EC', crv: 'P-256', alg: 'ES256', use: 'sig' })
    const sbx = await create({
      iam: { tokens: { api: Secret.iamToken({ audience, tokenType: 'JWT-SVID' }) } },
      network: {
        allowOut: ['api.example.test'], denyOut: ['0.0.0.0/0'],
        rules: { 'api.example.test': [{ transform: ({ iam }) => ({ headers: { Authorization: `Bearer ${iam.tokens.api}` } }) }] },
      },
    })
    const one = JSON.parse(await reaches(sbx, 'http://api.example.test/__svid'))
    expect(one.sub).toMatch(new RegExp(`^spiffe://[a-z0-9._-]+/team/[A-Za-z0-9._-]+/sandbox/${sbx.sandboxId}$`))
    expect(one.aud).toEqual([audience])
    expect(one.exp - one.iat).toBe(300)
    // Over HTTPS too (the proxy terminates TLS for a host with rules).
    const two = JSON.parse(await reaches(sbx, 'https://api.example.test/__svid'))
    expect(two.sub).toBe(one.sub)
    // The sandbox holds no token: not in any process's environment or
    // command line, nor in its files (a JWT-SVID's header starts so; the
    // command spells it and its marker so as not to find itself).
    const jwtHead = 'eyJhbGciOiJFUzI1NiIs'
    const seen = await sbx.commands.run(`env; cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' '\\n'; h=${jwtHead.slice(0, 10)}; grep -rls "\${h}${jwtHead.slice(10)}" /etc /run /tmp /root /home /var 2>/dev/null | sed "s/^/HIT$((1+1)):/"; true`)
    expect(seen.stdout).not.toContain(jwtHead)
    expect(seen.stdout).not.toContain('HIT2:')
    expect(JSON.stringify(await Sandbox.getInfo(sbx.sandboxId, opts()))).not.toContain(jwtHead)

    // Hostile: a token signed by another key that names a published
    // kid, sent to the relying party from here, is refused.
    const { privateKey } = crypto.generateKeyPairSync('ec', { namedCurve: 'P-256' })
    const b64 = (o) => Buffer.from(JSON.stringify(o)).toString('base64url')
    const now = Math.floor(Date.now() / 1000)
    const unsigned = `${b64({ alg: 'ES256', kid: jwks.keys[0].kid, typ: 'JWT' })}.${b64({ sub: one.sub, aud: [audience], iat: now, exp: now + 300 })}`
    const forged = `${unsigned}.${crypto.sign('sha256', Buffer.from(unsigned), { key: privateKey, dsaEncoding: 'ieee-p1363' }).toString('base64url')}`
    const res = await fetch(`http://${hosts.Web1}/__svid`, { headers: { Authorization: `Bearer ${forged}` } })
    expect(res.status).toBe(401)
    expect((await res.json()).error).toMatch(/signature/)
  })

  test('a token name the create did not ask for, or another type, is refused', async () => {
    const iam = { tokens: { api: { audience, tokenType: 'JWT-SVID' } } }
    const network = { rules: { 'api.example.test': [{ transform: { headers: { Authorization: 'Bearer ${e2b.identity.tokens.other}' } } }] } }
    await expect(Sandbox.create({ ...opts(), iam, network })).rejects.toThrow(/not in the sandbox's iam.tokens/)
    await expect(Sandbox.create({ ...opts(), iam: { tokens: { api: { audience, tokenType: 'OIDC' } } } })).rejects.toThrow(/only "JWT-SVID" is supported/)
    await expect(Sandbox.create({ ...opts(), network })).rejects.toThrow(/not in the sandbox's iam.tokens/)
  })
})

describe('egressProxy', () => {
  const socksStats = async () => (await fetch(`http://${hosts.Socks}:9000/`)).json()
  const networkLog = async (id) => {
    const res = await fetch(`${w.apiUrl}/v2/sandboxes/${id}/logs?source=network`, { headers: { 'X-API-Key': w.apiKey } })
    return (await res.json()).logs.map((l) => l.fields)
  }

  test('SOCKS5 with a password (E2B\'s egressProxy): all TCP egress goes through it; the password is never returned', async () => {
    const before = (await socksStats()).tunnels
    const proxy = { address: `${hosts.Socks}:1080`, username: 'user', password: 's0cks-pw-7Q' }
    const sbx = await create({ network: { egressProxy: proxy } })
    await reaches(sbx, `http://${hosts.Web1}/`, 'web1')
    await reaches(sbx, `-k https://${hosts.Web2}:8443/`, 'web2')
    const stats = await socksStats()
    expect(stats.tunnels).toBe(before + 2)
    expect(stats.targets).toEqual(expect.arrayContaining([`${hosts.Web1}:80`, `${hosts.Web2}:8443`]))
    const info = await Sandbox.getInfo(sbx.sandboxId, opts())
    expect(info.network.egressProxy).toEqual({ address: `${hosts.Socks}:1080`, username: 'user' })
    const log = await networkLog(sbx.sandboxId)
    expect(log.some((f) => f.decision === 'allow' && f.via === `${hosts.Socks}:1080`)).toBe(true)
    // The password enters neither the sandbox nor the log.
    const found = await sbx.commands.run('{ env; grep -rls s0cks-pw-7Q /etc /run /tmp /root /home; } 2>/dev/null | grep s0cks-pw-7Q || true')
    expect(found.stdout).toBe('')
    expect(JSON.stringify(log)).not.toContain('s0cks-pw-7Q')
  })

  test('SOCKS5 without a password; a domain-matched flow goes by name (remote DNS)', async () => {
    const sbx = await create({ network: { allowOut: ['api.example.test'], denyOut: ['0.0.0.0/0'], egressProxy: { address: `${hosts.Socks}:1081` } } })
    await reaches(sbx, 'http://api.example.test/', 'web1')
    await reaches(sbx, '-k https://api.example.test/', 'web1')
    // Aimed at another address by --resolve: the proxy still gets the name.
    await reaches(sbx, `--resolve api.example.test:80:${hosts.Web2} http://api.example.test/`, 'web1')
    await blocked(sbx, `http://${hosts.Web2}/`)
    const { targets } = await socksStats()
    expect(targets).toEqual(expect.arrayContaining(['api.example.test:80', 'api.example.test:443']))
    expect(targets).not.toContain(`${hosts.Web2}:80`)
  })

  test('a wrong password is refused with a clear error; it never goes out directly', async () => {
    const sbx = await create({ network: { egressProxy: { address: `${hosts.Socks}:1080`, username: 'user', password: 'wrong-pass' } } })
    const before = (await (await fetch(`http://${hosts.Web1}/__stats`)).json()).requests
    await blocked(sbx, `http://${hosts.Web1}/`)
    // No password at all, to a proxy that wants one: refused too.
    await sbx.updateNetwork({ egressProxy: { address: `${hosts.Socks}:1080` } })
    await blocked(sbx, `http://${hosts.Web1}/`)
    expect((await (await fetch(`http://${hosts.Web1}/__stats`)).json()).requests).toBe(before)
    const denied = (await networkLog(sbx.sandboxId)).filter((f) => f.decision === 'deny')
    expect(denied.some((f) => /egress proxy .*:1080: SOCKS5.*authentication failed/.test(f.reason))).toBe(true)
    expect(denied.some((f) => /no acceptable authentication methods/.test(f.reason))).toBe(true)
    expect(JSON.stringify(denied)).not.toContain('wrong-pass')
  })

  test('the proxy\'s own address is subject to the node\'s rules: private refused unless allowed', async () => {
    // 10.214.0.2 is allowed (--allow-private-cidr): it works.
    const sbx = await create({ network: { egressProxy: { address: `${hosts.SocksPrivate}:1080` } } })
    await reaches(sbx, `http://${hosts.Web1}/`, 'web1')
    // Any other private, loopback or node address is refused before anything exists.
    for (const address of ['10.0.0.1:1080', '127.0.0.1:1080', '169.254.169.254:1080', '192.168.1.1:1080']) {
      await expect(create({ network: { egressProxy: { address } } })).rejects.toThrow(/egressProxy/)
    }
    await expect(sbx.updateNetwork({ egressProxy: { address: '10.0.0.1:1080' } })).rejects.toThrow(/egressProxy/)
    await reaches(sbx, `http://${hosts.Web1}/`, 'web1')
  })

  test('an HTTP CONNECT proxy stays available at http://host:port (a Warren extension)', async () => {
    const stats = async () => (await (await fetch(`http://${hosts.Proxy}:9000/`)).json()).tunnels
    const before = await stats()
    const sbx = await create({ network: { egressProxy: { address: `http://${hosts.Proxy}:3128`, username: 'user', password: 'pass' } } })
    await reaches(sbx, `http://${hosts.Web1}/`, 'web1')
    await reaches(sbx, `-k https://${hosts.Web2}:8443/`, 'web2')
    expect(await stats()).toBe(before + 2)
    const info = await Sandbox.getInfo(sbx.sandboxId, opts())
    expect(info.network.egressProxy).toEqual({ address: `http://${hosts.Proxy}:3128`, username: 'user' })
    await sbx.updateNetwork({ egressProxy: { address: `http://${hosts.Proxy}:3128`, username: 'user', password: 'wrong' } })
    await blocked(sbx, `http://${hosts.Web1}/`)
    // Another scheme is a clear 400.
    await expect(create({ network: { egressProxy: { address: `https://${hosts.Proxy}:3128` } } })).rejects.toThrow(/no other scheme/)
  })
})

describe('persistence', () => {
  test('a policy survives pause and resume; an update while paused is in force on resume', async () => {
    // Paused by the reaper when its timeout is up (lifecycle onTimeout).
    const pausedSoon = { ...opts(), timeoutMs: 4_000 }
    const untilPaused = async (id) => {
      for (let i = 0; i < 60; i++) {
        if ((await Sandbox.getInfo(id, opts())).state === 'paused') return
        await new Promise((r) => setTimeout(r, 500))
      }
      throw new Error(`${id} was not paused in 30 s`)
    }
    const sbx = await create({ timeoutMs: 4_000, lifecycle: { onTimeout: 'pause' }, network: { allowOut: ['api.example.test'], denyOut: ['0.0.0.0/0'] } })
    await reaches(sbx, 'http://api.example.test/', 'web1')
    await untilPaused(sbx.sandboxId)
    const again = await Sandbox.connect(sbx.sandboxId, pausedSoon)
    await reaches(again, 'http://api.example.test/', 'web1')
    await blocked(again, `http://${hosts.Web2}/`)
    await untilPaused(sbx.sandboxId)
    await Sandbox.updateNetwork(sbx.sandboxId, { allowOut: [hosts.Web2], denyOut: ['0.0.0.0/0'] }, opts())
    const third = await Sandbox.connect(sbx.sandboxId, { ...opts(), timeoutMs: 60_000 })
    await reaches(third, `http://${hosts.Web2}/`, 'web2')
    await blocked(third, 'http://api.example.test/')
    expect((await Sandbox.getInfo(sbx.sandboxId, opts())).network.allowOut).toEqual([hosts.Web2])
  }, 120_000)

  test('a policy survives a restart of warren serve', async () => {
    const sbx = await create({ network: { allowOut: ['api.example.test'], denyOut: ['0.0.0.0/0'] } })
    await reaches(sbx, 'http://api.example.test/', 'web1')
    const dataDir = w.dataDir
    await w.stop()
    w = await startWarren({
      dataDir, instance: 'egr', net16: 173, poolSize: 1, extraArgs: warrenArgs(),
    })
    const again = await Sandbox.connect(sbx.sandboxId, opts())
    await reaches(again, 'http://api.example.test/', 'web1')
    await blocked(again, `http://${hosts.Web2}/`)
    await blocked(again, `http://${hosts.Web1}/`)
    const info = await Sandbox.getInfo(sbx.sandboxId, opts())
    expect(info.network.allowOut).toEqual(['api.example.test'])
  }, 120_000)
})
