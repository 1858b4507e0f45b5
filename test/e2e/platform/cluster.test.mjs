// A cluster on this machine, driven through the official SDK: PostgreSQL
// (a database of its own), two `--role api` processes and two `--role
// node` processes, each node with its own data dir, network prefix,
// address range and ports. Sandboxes spread over both nodes and are
// reached through either api; a node's internal address refuses requests
// without the cluster secret; cordon stops placement; restarting an api
// loses nothing; a template built through the api starts on the node
// that built it, and on the other node, which pulls its image; so does a
// snapshot, with its processes; a volume is shared by
// sandboxes on both nodes; `kill -9` of a node makes its sandboxes gone (404)
// within the lost timeout while the other node serves and takes the new
// creates, and the node's restart brings them back. Egress on either node
// goes through a SOCKS5 egressProxy; a workload identity token minted on
// either node verifies against the api's JWKS (every node's key); an api
// whose placement times out (a node that hangs) answers 504
// sandbox_placement_timeout. Sandbox.create({ mcp }) works through the
// api: the gateway on a node, reached through the api's proxy.
import { afterAll, afterEach, beforeAll, beforeEach, expect, test } from 'vitest'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import http from 'node:http'
import os from 'node:os'
import path from 'node:path'
import { Sandbox, NotFoundError, Template, Volume, waitForFile } from 'e2b'
import { startCluster } from '../setup/start-cluster.mjs'
import { startEgressHosts } from '../setup/egress-hosts.mjs'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { buildSync } from 'esbuild'
import { createRequire } from 'node:module'

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))
// The apis place by the nodes' states in the store, read at most 500 ms
// before (internal/dispatch nodesTTL); a node that believes itself
// cordoned asks the store again before it refuses (cluster.Member.Admit).
// So a cordon or an uncordon is in force for placement after this, with
// no heartbeat to wait for.
const apisSeeNodeStates = () => sleep(700)
// until polls check (every 200 ms, at most 15 s) until it holds.
async function until(what, check) {
  let last
  for (const end = Date.now() + 15_000; Date.now() < end; await sleep(200)) {
    try {
      if (await check()) return
    } catch (e) {
      last = e
    }
  }
  throw new Error(`not within 15 s: ${what}${last ? `: ${last.message}` : ''}`)
}

let c, nodes, apis, nodeOf, nodeRow, warrenNodes, startNode, startAPI, hosts
beforeAll(async () => {
  // Stand-in internet hosts (198.18.0.0/15) for the egress test.
  hosts = await startEgressHosts({ prefix: 'e24' })
  c = await startCluster({
    nodes: { na: { prefix: 'wcna', net16: 139 }, nb: { prefix: 'wcnb', net16: 140 } }, apis: 2,
    nodeArgs: ['--resolv-conf', hosts.ResolvConf, '--egress-ca-file', hosts.CAFile],
    // Webhooks to the test's loopback receiver are allowed (issue 25).
    extraArgs: ['--webhook-allow-cidr', '127.0.0.0/8'],
  })
  ;({ nodes, apis, nodeOf, nodeRow, warrenNodes } = c)
  startNode = c.startNode
  startAPI = c.startAPI
}, 120_000)

afterAll(async () => {
  await c?.stop()
  await hosts?.stop()
}, 120_000)

// A failed test prints what the cluster's processes warned of, and where
// the apis placed sandboxes, while it ran: CI keeps nothing else.
const logFrom = new Map()
const procs = () => [...Object.entries(c.nodes), ...c.apis.map((a, i) => [`api${i}`, a])].filter(([, p]) => p.proc)
beforeEach(() => {
  for (const [name, p] of procs()) logFrom.set(name, { proc: p.proc, at: p.proc.output().length })
})
afterEach(({ task }) => {
  if (task.result?.state !== 'fail') return
  for (const [name, p] of procs()) {
    const from = logFrom.get(name)
    const lines = p.proc.output().slice(from?.proc === p.proc ? from.at : 0).split('\n')
      .filter((l) => /level=(WARN|ERROR)|dispatch/.test(l))
    console.error(`--- ${name}: ${lines.length} warnings and placements while the test ran\n${lines.slice(-60).join('\n')}`)
  }
})

test('20 sandboxes spread over both nodes and are reached through the api: commands, files, ports, signed URLs', async () => {
  const opts = apis[0].opts
  const sbxs = await Promise.all(Array.from({ length: 20 }, () => Sandbox.create(opts)))
  const byNode = {}
  for (const s of sbxs) (byNode[nodeOf(s.sandboxId)] ??= []).push(s)
  expect(Object.keys(byNode).sort()).toEqual(['na', 'nb'])
  // `warren nodes` counts them once the nodes' heartbeats have.
  await until('the heartbeats count the sandboxes', () => ['na', 'nb'].every((name) => Number(nodeRow(name)[2]) >= byNode[name].length))
  for (const name of ['na', 'nb']) {
    const row = nodeRow(name) // NAME STATE SANDBOXES ADDRESS RUNTIME FREE_CPU FREE_MEMORY_MB FREE_DISK_MB LABELS …
    expect(Number(row[2])).toBeGreaterThanOrEqual(byNode[name].length)
    expect(row[3]).toBe(`127.0.0.1:${nodes[name].port}`)
    expect(Number(row[7])).toBeGreaterThan(0)
    expect(row[8]).toBe(`zone=${name}`)
  }

  for (const name of ['na', 'nb']) {
    const s = byNode[name][0]
    expect((await s.commands.run('hostname')).stdout).toBe(`${s.sandboxId}\n`)
    await s.files.write('/home/user/hello.txt', `hello from ${name}`)
    expect(await s.files.read('/home/user/hello.txt')).toBe(`hello from ${name}`)
    // A signed URL names no sandbox: the api finds it by its signature.
    const url = await s.downloadUrl('/home/user/hello.txt')
    expect(url).not.toContain(s.sandboxId)
    expect(await (await fetch(url)).text()).toBe(`hello from ${name}`)
    // A port of the sandbox, through the api's proxy.
    await s.commands.run('mkdir -p /tmp/www && echo port-of-' + name + ' > /tmp/www/index.html')
    await s.commands.run('cd /tmp/www && python3 -m http.server 8000', { background: true })
    let body = ''
    for (let i = 0; i < 50 && !body.startsWith('port-of'); i++) {
      const res = await fetch(`${opts.sandboxUrl}/index.html`, { headers: { 'E2b-Sandbox-Id': s.sandboxId, 'E2b-Sandbox-Port': '8000' } })
      body = await res.text()
      if (!body.startsWith('port-of')) await sleep(200)
    }
    expect(body).toBe(`port-of-${name}\n`)
  }

  // A command's stream through the api ends at once when its sandbox is
  // killed, on either node.
  for (const name of ['na', 'nb']) {
    const s = byNode[name][1]
    const h = await s.commands.run('sleep 600', { background: true })
    const t0 = Date.now()
    await Sandbox.kill(s.sandboxId, opts)
    await expect(h.wait()).rejects.toThrow()
    expect(Date.now() - t0).toBeLessThan(10_000)
  }
  await Promise.all(sbxs.map((s) => s.kill()))
  expect(await Sandbox.list(opts).nextItems()).toEqual([])

  // Every role serves its metrics: the api its proxy's and the store's,
  // a node its sandboxes' and capacity.
  const scrape = async (port) => (await fetch(`http://127.0.0.1:${port}/metrics`)).text()
  const api = await scrape(apis[0].metricsPort)
  expect(api).toMatch(/^warren_proxy_requests_total\{code_class="2xx"\} [1-9]/m)
  expect(api).toContain('warren_store_operation_duration_seconds_bucket{operation="GetSandbox"')
  const node = await scrape(nodes.na.metricsPort)
  expect(node).toContain('warren_node_info{node="na",runtime="runsc"} 1')
  expect(node).toMatch(/^warren_sandbox_operations_total\{operation="create",outcome="ok"\} [1-9]/m)
}, 180_000)

test('lifecycle events made on either node reach a webhook exactly once, whichever of the four processes delivers', async () => {
  const got = []
  const sbxs = []
  let killed = false
  const receiver = http.createServer((req, res) => {
    let raw = ''
    req.on('data', (d) => (raw += d))
    req.on('end', () => { got.push(JSON.parse(raw)); res.writeHead(200).end() })
  })
  await new Promise((r) => receiver.listen(0, '127.0.0.1', r))
  try {
    const res = await fetch(`${apis[0].opts.apiUrl}/events/webhooks`, {
      method: 'POST', headers: { 'X-API-Key': c.apiKey, 'Content-Type': 'application/json' },
      body: JSON.stringify({ name: 'cluster', url: `http://127.0.0.1:${receiver.address().port}/`, enabled: true,
        events: ['sandbox.lifecycle.created', 'sandbox.lifecycle.killed'], signatureSecret: 'cluster-secret' }),
    })
    expect(res.status).toBe(201)
    // Three on each node, whatever warm sandboxes the placement would
    // prefer: the other node cordoned while each three are made.
    for (const [made, other] of [['na', 'nb'], ['nb', 'na']]) {
      warrenNodes('cordon', other)
      await apisSeeNodeStates()
      try {
        sbxs.push(...await Promise.all(Array.from({ length: 3 }, (_, i) => Sandbox.create(apis[i % 2].opts))))
      } finally {
        warrenNodes('uncordon', other)
      }
      expect(sbxs.slice(-3).map((s) => nodeOf(s.sandboxId))).toEqual([made, made, made])
    }
    await apisSeeNodeStates()
    await Promise.all(sbxs.map((s, i) => Sandbox.kill(s.sandboxId, apis[(i + 1) % 2].opts)))
    killed = true
    const deadline = Date.now() + 20_000
    while (got.length < 12 && Date.now() < deadline) await sleep(50)
    await sleep(1500) // a second delivery by another process would come now
    const ids = got.map((e) => e.id)
    expect(new Set(ids).size).toBe(ids.length)
    expect(got.length).toBe(12)
    for (const s of sbxs) {
      expect(got.filter((e) => e.sandboxId === s.sandboxId).map((e) => e.type))
        .toEqual(['sandbox.lifecycle.created', 'sandbox.lifecycle.killed'])
    }
  } finally {
    if (!killed) await Promise.allSettled(sbxs.map((s) => Sandbox.kill(s.sandboxId, apis[0].opts)))
    receiver.closeAllConnections()
    receiver.close()
  }
})

test("a node's internal address refuses requests without the cluster secret", async () => {
  const base = `http://127.0.0.1:${nodes.na.port}`
  const rpc = `${base}/warren.node.v1.NodeService/CreateSandbox`
  const body = JSON.stringify({ teamId: 'x', templateId: 'base' })
  const json = { 'Content-Type': 'application/json' }
  expect((await fetch(rpc, { method: 'POST', headers: json, body })).status).toBe(401)
  const forged = { ...json, 'Warren-Cluster-Auth': `${Math.floor(Date.now() / 1000)}.${'0'.repeat(64)}` }
  expect((await fetch(rpc, { method: 'POST', headers: forged, body })).status).toBe(401)
  // Forwarded sandbox traffic likewise.
  const traffic = await fetch(`${base}/files?path=/etc/passwd`, { headers: { 'E2b-Sandbox-Id': 'abc', 'E2b-Sandbox-Port': '49983' } })
  expect(traffic.status).toBe(401)
  expect((await fetch(`${base}/health`)).status).toBe(200)
})

test('cordon stops placement on a node; uncordon brings it back', async () => {
  const opts = apis[0].opts
  expect(warrenNodes('cordon', 'na')).toContain('cordoned')
  try {
    const sbxs = await Promise.all(Array.from({ length: 4 }, () => Sandbox.create(opts)))
    expect(sbxs.map((s) => nodeOf(s.sandboxId))).toEqual(['nb', 'nb', 'nb', 'nb'])
    await Promise.all(sbxs.map((s) => s.kill()))
  } finally {
    warrenNodes('uncordon', 'na')
  }
  await apisSeeNodeStates()
  // Placement orders the nodes by their last heartbeat's load, which may
  // still count the sandboxes just killed: na takes one of at most eight
  // creates, made one at a time. Killed whatever the outcome, so that a
  // failure here leaves nothing to the next tests.
  const again = []
  try {
    while (again.length < 8 && !again.some((s) => nodeOf(s.sandboxId) === 'na')) again.push(await Sandbox.create(opts))
    expect(new Set(again.map((s) => nodeOf(s.sandboxId)))).toContain('na')
  } finally {
    await Promise.all(again.map((s) => s.kill()))
  }
}, 120_000)

test('two api processes serve the same sandboxes, and restarting one loses nothing', async () => {
  const [one, two] = apis
  const s = await Sandbox.create(one.opts)
  await s.commands.run('echo kept > /tmp/state')
  const viaTwo = await Sandbox.connect(s.sandboxId, two.opts)
  expect((await viaTwo.commands.run('cat /tmp/state')).stdout).toBe('kept\n')
  expect((await Sandbox.list(two.opts).nextItems()).map((i) => i.sandboxId)).toContain(s.sandboxId)

  await one.proc.stop()
  await startAPI(0)
  const back = await Sandbox.connect(s.sandboxId, apis[0].opts)
  expect((await back.commands.run('cat /tmp/state')).stdout).toBe('kept\n')
  expect((await Sandbox.getInfo(s.sandboxId, apis[0].opts)).state).toBe('running')
  // Pause through one api, resume through the other.
  expect(await Sandbox.pause(s.sandboxId, apis[0].opts)).toBe(true)
  const resumed = await Sandbox.connect(s.sandboxId, two.opts)
  expect((await resumed.commands.run('cat /tmp/state')).stdout).toBe('kept\n')
  await resumed.kill()
}, 120_000)

test('a template built through the api runs on its node, and on the other once it pulls it; so does a snapshot, its processes with it', async () => {
  const [one, two] = apis
  const name = `cluster-tpl-${Date.now()}`
  // A file to upload (through the api, to the template's home), a step,
  // and a start command (its sandboxes are restored from a checkpoint).
  const ctx = mkdtempSync(path.join(os.tmpdir(), 'warren-e2e-ctx-'))
  writeFileSync(path.join(ctx, 'hello.txt'), 'copied through the api\n')
  const tpl = Template({ fileContextPath: ctx })
    .fromTemplate('base')
    .copy('hello.txt', '/tmp/hello.txt')
    .runCmd('echo built-in-the-cluster > /tmp/built.txt')
    .setStartCmd('echo started > /tmp/started && sleep infinity', waitForFile('/tmp/started'))
  try {
    await Template.build(tpl, name, { ...one.opts })
  } finally {
    rmSync(ctx, { recursive: true, force: true })
  }
  expect(await Template.exists(name, two.opts)).toBe(true)
  const check = async (s) => {
    expect((await s.commands.run('cat /tmp/hello.txt /tmp/built.txt /tmp/started')).stdout)
      .toBe('copied through the api\nbuilt-in-the-cluster\nstarted\n')
    expect((await s.commands.run('pgrep -x sleep >/dev/null && echo running')).stdout).toBe('running\n')
  }
  const homes = new Set()
  for (let i = 0; i < 3; i++) {
    const s = await Sandbox.create(name, two.opts)
    await check(s)
    homes.add(nodeOf(s.sandboxId))
    await s.kill()
  }
  expect(homes.size).toBe(1) // its home: the node that built it
  // The other node pulls its image from there when it has to start one.
  const [home] = homes
  const other = home === 'na' ? 'nb' : 'na'
  warrenNodes('cordon', home)
  try {
    await apisSeeNodeStates()
    const s = await Sandbox.create(name, two.opts)
    expect(nodeOf(s.sandboxId)).toBe(other)
    await check(s) // its layers and its checkpoint came along
    await s.kill()
  } finally {
    warrenNodes('uncordon', home)
  }
  await apisSeeNodeStates()

  // A snapshot starts on either node: the other pulls its checkpoint.
  const p = await Sandbox.create(one.opts)
  await p.commands.run('sleep 3600 & echo $! > /tmp/bg.pid')
  await p.files.write('/home/user/snap.txt', 'from ' + p.sandboxId)
  const snap = await p.createSnapshot()
  const at = nodeOf(p.sandboxId)
  const elsewhere = at === 'na' ? 'nb' : 'na'
  warrenNodes('cordon', at)
  try {
    await apisSeeNodeStates()
    const child = await Sandbox.create(snap.snapshotId, one.opts)
    expect(nodeOf(child.sandboxId)).toBe(elsewhere)
    expect(await child.files.read('/home/user/snap.txt')).toBe('from ' + p.sandboxId)
    // Its processes came along (restored, not booted).
    expect((await child.commands.run('kill -0 $(cat /tmp/bg.pid) && echo alive')).stdout).toBe('alive\n')
    expect((await child.commands.run('hostname')).stdout).toBe(`${child.sandboxId}\n`)
    await child.kill()
  } finally {
    warrenNodes('uncordon', at)
  }
  await p.kill()
}, 300_000)

test('a team volume, made through one api, is shared by sandboxes on both nodes', async () => {
  const [one, two] = apis
  const vol = await Volume.create(`cluster-vol-${Date.now()}`, one.opts)
  await vol.writeFile('/from-api.txt', 'written through the api', { ...one.opts })
  const sbxs = []
  const on = {}
  for (let i = 0; i < 8 && Object.keys(on).length < 2; i++) {
    const s = await Sandbox.create({ ...one.opts, volumeMounts: { '/data': vol } })
    sbxs.push(s)
    on[nodeOf(s.sandboxId)] = s
  }
  expect(Object.keys(on).sort()).toEqual(['na', 'nb'])
  expect((await on.na.commands.run('cat /data/from-api.txt')).stdout).toBe('written through the api')
  await on.na.commands.run('echo from-na > /data/na.txt')
  expect((await on.nb.commands.run('cat /data/na.txt')).stdout).toBe('from-na\n')
  const again = await Volume.connect(vol.volumeId, two.opts)
  expect(await again.readFile('/na.txt', { ...two.opts })).toBe('from-na\n')
  // In use: not deleted (the message names the sandboxes).
  await expect(Volume.destroy(vol.volumeId, two.opts)).rejects.toThrow(/^409: /)
  await Promise.all(sbxs.map((s) => s.kill()))
  expect(await Volume.destroy(vol.volumeId, two.opts)).toBe(true)
}, 120_000)

test('kill -9 of a node: its sandboxes are gone within the lost timeout, the other node serves and takes the creates', async () => {
  const opts = apis[0].opts
  // Two or more on each node (placement spreads them; how evenly
  // depends on what the heartbeats said last).
  const sbxs = []
  const on = (name) => sbxs.filter((s) => nodeOf(s.sandboxId) === name)
  while ((on('na').length < 2 || on('nb').length < 2) && sbxs.length < 16) sbxs.push(await Sandbox.create(opts))
  const onA = on('na')
  const onB = on('nb')
  expect(onA.length).toBeGreaterThanOrEqual(2)
  expect(onB.length).toBeGreaterThanOrEqual(2)

  await nodes.na.proc.stop('SIGKILL')
  const t0 = Date.now()
  let gone
  while (Date.now() - t0 < 20_000) {
    try {
      await Sandbox.connect(onA[0].sandboxId, opts)
    } catch (e) {
      if (e instanceof NotFoundError) {
        gone = Date.now() - t0
        break
      }
      // Until the node is lost: 503, the node does not answer.
      expect(e.message).toMatch(/unreachable|unavailable/i)
    }
    await sleep(250)
  }
  expect(gone).toBeDefined()
  console.log(`kill -9 of node na: its sandbox answered 404 after ${gone} ms`)
  expect(gone).toBeLessThan(15_000) // the lost timeout is 10 s
  await expect(Sandbox.getInfo(onA[0].sandboxId, opts)).rejects.toThrow(NotFoundError)
  expect((await Sandbox.list(opts).nextItems()).map((i) => i.sandboxId).sort()).toEqual(onB.map((s) => s.sandboxId).sort())
  expect(nodeRow('na')[1]).toBe('lost')

  expect((await onB[0].commands.run('echo still')).stdout).toBe('still\n')
  const fresh = await Promise.all(Array.from({ length: 3 }, () => Sandbox.create(opts)))
  expect(fresh.map((s) => nodeOf(s.sandboxId))).toEqual(['nb', 'nb', 'nb'])

  // The node's restart adopts its sandboxes: they are back.
  await startNode('na')
  let back
  await until('the restarted node serves its sandbox again', async () => (back = await Sandbox.connect(onA[0].sandboxId, opts)))
  expect((await back.commands.run('echo back')).stdout).toBe('back\n')
  await Promise.all([...sbxs, ...fresh].map((s) => s.kill()))
}, 180_000)

// createOn makes sandboxes with opts until one is on each node.
async function oneOnEach(opts) {
  const made = []
  const on = (name) => made.find((s) => nodeOf(s.sandboxId) === name)
  while ((!on('na') || !on('nb')) && made.length < 12) made.push(await Sandbox.create(opts))
  expect(on('na')).toBeDefined()
  expect(on('nb')).toBeDefined()
  return { made, na: on('na'), nb: on('nb') }
}

test('egress on either node: a SOCKS5 egressProxy with and without a password, a wrong one refused; identity tokens verify against the api\'s JWKS', async () => {
  const opts = apis[0].opts
  const curl = async (s, url) => s.commands.run(`curl -sS --max-time 10 ${url}`).then((r) => r.stdout, (e) => `exit ${e.exitCode}`)
  const tunnels = async () => (await (await fetch(`http://${hosts.Socks}:9000/`)).json()).tunnels
  // The api's JWKS holds every node's identity key.
  const jwks = await (await fetch(`${opts.apiUrl}/.well-known/jwks.json`)).json()
  expect(jwks.keys.length).toBe(2)
  writeFileSync(hosts.JWKSFile, `${opts.apiUrl}/.well-known/jwks.json`)
  const audience = 'https://api.example.test'
  const { made, na, nb } = await oneOnEach({
    ...opts,
    iam: { tokens: { api: { audience, tokenType: 'JWT-SVID' } } },
    network: {
      egressProxy: { address: `${hosts.Socks}:1080`, username: 'user', password: 's0cks-pw-7Q' },
      rules: { 'api.example.test': [{ transform: ({ iam }) => ({ headers: { Authorization: `Bearer ${iam.tokens.api}` } }) }] },
    },
  })
  try {
    for (const s of [na, nb]) {
      const before = await tunnels()
      expect(await curl(s, `http://${hosts.Web1}/`)).toContain('server=web1')
      expect(await tunnels()).toBeGreaterThan(before)
      // Minted by the sandbox's node, verified by a relying party
      // against the api's JWKS.
      const v = JSON.parse(await curl(s, 'http://api.example.test/__svid'))
      expect(v.sub).toMatch(new RegExp(`/sandbox/${s.sandboxId}$`))
    }
  } finally {
    await Promise.all(made.map((s) => s.kill()))
  }
  // Without a password; and a wrong one fails closed.
  const open = await oneOnEach({ ...opts, network: { egressProxy: { address: `${hosts.Socks}:1081` } } })
  const wrong = await Sandbox.create({ ...opts, network: { egressProxy: { address: `${hosts.Socks}:1080`, username: 'user', password: 'wrong' } } })
  try {
    for (const s of [open.na, open.nb]) expect(await curl(s, `http://${hosts.Web2}/`)).toContain('server=web2')
    expect(await curl(wrong, `http://${hosts.Web2}/`)).toMatch(/^exit [1-9]/)
  } finally {
    await Promise.all([...open.made, wrong].map((s) => s.kill()))
  }
}, 120_000)

test('Sandbox.create({ mcp }) through the api: an npm MCP server listed and called from the gateway on its node', async () => {
  const opts = apis[0].opts
  // The npm server pre-pulled into a template FROM mcp-gateway, as in
  // mcp.test.mjs (sandboxes here reach no registry).
  const key = 'github/modelcontextprotocol/servers'
  const ctx = mkdtempSync(path.join(os.tmpdir(), 'warren-cluster-mcp-'))
  try {
    buildSync({
      entryPoints: [createRequire(import.meta.url).resolve('@modelcontextprotocol/server-memory/dist/index.js')],
      bundle: true, platform: 'node', target: 'node18', format: 'esm', logLevel: 'error',
      outfile: path.join(ctx, 'memory-server.mjs'),
      banner: { js: "import { createRequire as __cr } from 'node:module'; const require = __cr(import.meta.url);" },
    })
    const name = `cluster-mcp-${Date.now()}`
    await Template.build(Template({ fileContextPath: ctx }).fromTemplate('mcp-gateway')
      .copy('memory-server.mjs', '/home/user/mcp-servers/modelcontextprotocol/servers/', { user: 'user' }), name, { ...opts })
    const sbx = await Sandbox.create({ ...opts, template: name, mcp: { [key]: { runCmd: 'node memory-server.mjs' } } })
    try {
      // getMcpUrl() is https://50005-<id>.<domain>; this cluster's api
      // serves its proxy over HTTP: the same port through it by headers.
      const transport = new StreamableHTTPClientTransport(new URL(`${opts.sandboxUrl}/mcp`), {
        requestInit: { headers: { Authorization: `Bearer ${await sbx.getMcpToken()}`, 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '50005' } },
      })
      const client = new Client({ name: 'warren-cluster-e2e', version: '1.0.0' })
      await client.connect(transport)
      try {
        const prefix = 'github-modelcontextprotocol-servers__'
        expect((await client.listTools()).tools.map((t) => t.name)).toContain(`${prefix}read_graph`)
        const graph = await client.callTool({ name: `${prefix}read_graph`, arguments: {} })
        expect(JSON.parse(graph.content[0].text)).toEqual({ entities: [], relations: [] })
      } finally {
        await client.close()
      }
    } finally {
      await sbx.kill()
    }
  } finally {
    rmSync(ctx, { recursive: true, force: true })
  }
}, 180_000)

test('an api whose placement times out (the node hangs) answers 504 sandbox_placement_timeout', async () => {
  // Its own flag for this start only: the tests above need no bound.
  await c.apis[1].proc.stop()
  await startAPI(1, ['--placement-timeout', '3s'])
  const opts = apis[1].opts
  warrenNodes('cordon', 'na')
  nodes.nb.proc.proc.kill('SIGSTOP')
  try {
    const t0 = Date.now()
    const res = await fetch(`${opts.apiUrl}/sandboxes`, {
      method: 'POST', headers: { 'X-API-Key': opts.apiKey, 'Content-Type': 'application/json' }, body: JSON.stringify({ templateID: 'base' }),
    })
    const body = await res.json()
    expect(res.status).toBe(504)
    expect(body).toMatchObject({ code: 504, error_code: 'sandbox_placement_timeout' })
    expect(body.message).toMatch(/^Failed to place sandbox: /)
    expect(Date.now() - t0).toBeLessThan(10_000)
  } finally {
    nodes.nb.proc.proc.kill('SIGCONT')
    warrenNodes('uncordon', 'na')
  }
  // Nothing is left of the abandoned create once the node runs again.
  await sleep(3000)
  for (let i = 0; i < 20 && (await Sandbox.list(opts).nextItems()).length > 0; i++) await sleep(500)
  expect(await Sandbox.list(opts).nextItems()).toEqual([])
}, 60_000)
