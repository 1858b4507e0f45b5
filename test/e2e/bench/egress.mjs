// Benchmarks egress policies (issue 14) through the official SDK against
// a real `warren serve`: from a sandbox to a stand-in internet host in a
// network namespace of its own (test/e2e/egresshost, 198.18.0.0/15), the
// time to the first byte of a request on a new connection (connection
// setup) and the download throughput, with no policy, an address policy
// (1000 denied ranges and an allowed host: the kernel's sets), a domain
// policy (the egress proxy splices) and a header-injecting rule over HTTP
// and HTTPS (the proxy parses, or terminates and re-encrypts). The
// measuring runs inside the sandbox (python3), so the SDK's round trips
// are not in it. Loops are bounded in count and time. Run by `make bench`.
import { readFileSync, rmSync } from 'node:fs'
import { Sandbox, Secret } from 'e2b'
import { startWarren, killAll } from '../setup/start-warren.mjs'
import { startEgressHosts } from '../setup/egress-hosts.mjs'
import { Table } from './stats.mjs'

const CONNECTIONS = 300 // per case, each a new connection
const DOWNLOAD_MB = 128 // per throughput run; 3 runs per case

// Runs in the sandbox: argv url, mode ("ttfb" or "mbps"), count. Prints
// the samples as JSON (milliseconds, or MB/s).
const probe = String.raw`
import http.client, json, ssl, sys, time, urllib.parse
url, mode, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
u = urllib.parse.urlsplit(url)
ctx = ssl.create_default_context()
ctx.load_verify_locations('/tmp/test-ca.pem')
def conn():
    if u.scheme == 'https':
        return http.client.HTTPSConnection(u.hostname, u.port or 443, context=ctx, timeout=10)
    return http.client.HTTPConnection(u.hostname, u.port or 80, timeout=10)
out, deadline = [], time.monotonic() + 60
for i in range(n):
    if time.monotonic() > deadline:
        break
    path = u.path or '/'
    if mode == 'mbps':
        path = '/bytes?n=%d' % (${DOWNLOAD_MB} << 20)
    t0 = time.perf_counter()
    c = conn()
    c.request('GET', path)
    r = c.getresponse()
    if mode == 'ttfb':
        r.read()
        out.append((time.perf_counter() - t0) * 1000)
    else:
        got = 0
        while True:
            b = r.read(1 << 20)
            if not b:
                break
            got += len(b)
        out.append(got / (1 << 20) / (time.perf_counter() - t0))
    c.close()
print(json.dumps(out))
`

const hosts = await startEgressHosts({ prefix: 'e14b' })
const w = await startWarren({
  instance: 'ebn', net16: 133, poolSize: 0,
  extraArgs: ['--resolv-conf', hosts.ResolvConf, '--egress-ca-file', hosts.CAFile],
})
const conn = { apiUrl: w.apiUrl, sandboxUrl: w.sandboxUrl, apiKey: w.apiKey }
const table = new Table()
const ca = readFileSync(hosts.CAFile, 'utf8')
const secretName = `bench-token-${Date.now()}`

async function run(sbx, url, mode, n) {
  const r = await sbx.commands.run(`python3 /tmp/probe.py '${url}' ${mode} ${n}`, { timeoutMs: 120_000 })
  return JSON.parse(r.stdout)
}

// Each case has a sandbox of its own that runs with and without the
// case's policy in turn (PUT /sandboxes/{id}/network between slices): a
// policy's cost is the p50 with it minus the p50 without it in the same
// sandbox, so that what two sandboxes differ by anyway (their slots, the
// scheduling of their runsc) does not count as the policy's. Slices
// alternate which state goes first, and the cases run interleaved, ROUNDS
// rounds of a slice each, so that the drift of a shared 2-core box over
// the minutes of a run falls on every case and state alike.
const ROUNDS = 10
const THROUGHPUT_ROUNDS = 12

async function prepare() {
  const sbx = await Sandbox.create({ ...conn })
  await sbx.files.write('/tmp/probe.py', probe)
  await sbx.files.write('/tmp/test-ca.pem', ca)
  return sbx
}

function p50(xs) {
  const s = [...xs].sort((a, b) => a - b)
  return s[Math.floor((s.length - 1) / 2)]
}

async function benchAll(cases) {
  const sbxs = []
  try {
    for (const _ of cases) sbxs.push(await prepare())
    // state 0: no policy, 1: the case's.
    const set = (i, on) => sbxs[i].updateNetwork(on ? cases[i].network : {})
    const ttfb = cases.map(() => [[], []])
    const mbps = cases.map(() => [[], []])
    // Warm up: the proxy's name checks, python's imports.
    for (const [i, c] of cases.entries()) {
      for (const on of [1, 0]) {
        await set(i, on)
        await run(sbxs[i], c.url, 'ttfb', 20)
      }
    }
    for (let r = 0; r < ROUNDS; r++) {
      for (const [i, c] of cases.entries()) {
        for (const on of r % 2 ? [0, 1] : [1, 0]) {
          await set(i, on)
          ttfb[i][on].push(...await run(sbxs[i], c.url, 'ttfb', CONNECTIONS / ROUNDS))
        }
      }
    }
    for (let r = 0; r < THROUGHPUT_ROUNDS; r++) {
      for (const [i, c] of cases.entries()) {
        for (const on of r % 2 ? [0, 1] : [1, 0]) {
          await set(i, on)
          mbps[i][on].push(...await run(sbxs[i], c.url, 'mbps', 1))
        }
      }
    }
    for (const [i, c] of cases.entries()) {
      for (const on of [0, 1]) {
        const label = on ? c.label : `${c.label}: the same sandbox without it`
        table.latency(`connection + first byte, ${label}`, ttfb[i][on].sort((a, b) => a - b))
        table.throughput(`download ${DOWNLOAD_MB} MiB, ${label}`, mbps[i][on])
      }
    }
    console.log('\nadded to a connection (p50 with the policy minus p50 without it, same sandbox) and throughput with it against without it')
    console.log('(the median of the rounds\' ratios: each round downloads with and without the policy one right after the other):')
    for (const [i, c] of cases.entries()) {
      const added = p50(ttfb[i][1]) - p50(ttfb[i][0])
      const ratio = p50(mbps[i][1].map((v, r) => v / mbps[i][0][r]))
      console.log(`  ${c.label.padEnd(40)} ${added >= 0 ? '+' : ''}${added.toFixed(2)} ms, ${(ratio * 100).toFixed(0)} %`)
    }
  } finally {
    for (const sbx of sbxs) await sbx.kill().catch(() => {})
  }
}

try {
  await Secret.create(secretName, 'bench-secret-value', conn)
  const cidrs = Array.from({ length: 1000 }, (_, i) => `203.0.${i >> 8}.${i & 255}/32`)
  const domain = 'api.example.test'
  const rule = { [domain]: [{ transform: { headers: { Authorization: `Bearer ${Secret.fill(secretName)}` } } }] }
  const domainOnly = { allowOut: [domain], denyOut: ['0.0.0.0/0'] }
  const cases = [
    // A policy that changes nothing: what the figures below differ by
    // when nothing differs.
    { label: 'an empty policy (control, HTTP)', network: {}, url: `http://${domain}/` },
    { label: 'address policy, 1001 ranges (HTTP)', network: { allowOut: [hosts.Web1], denyOut: ['0.0.0.0/0', ...cidrs] }, url: `http://${domain}/` },
    { label: 'domain policy, proxied (HTTP)', network: domainOnly, url: `http://${domain}/` },
    { label: 'header rule (HTTP)', network: { ...domainOnly, rules: rule }, url: `http://${domain}/` },
    { label: 'domain policy, proxied (HTTPS, SNI)', network: domainOnly, url: `https://${domain}/` },
    { label: 'header rule (HTTPS, intercepted)', network: { ...domainOnly, rules: rule }, url: `https://${domain}/` },
  ]
  await benchAll(cases)
  table.print()
  console.log('targets: an address policy adds < 0.1 ms per connection; the domain proxy ≤ 1 ms and ≥ 80 % of the direct throughput')
} finally {
  await Secret.destroy(secretName, conn).catch(() => {})
  await killAll(w).catch(() => {})
  await w.stop()
  const problems = w.output().split('\n').filter((l) => /level=(WARN|ERROR)/.test(l))
  if (problems.length) console.error(problems.join('\n'))
  rmSync(w.dataDir, { recursive: true, force: true })
  await hosts.stop()
}
