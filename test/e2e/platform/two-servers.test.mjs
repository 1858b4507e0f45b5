// Two `warren serve` on one host, each with its own data dir and nothing
// else given: each derives its own network prefix, range, run dir and
// cgroup parent from its data dir, neither touches the other's sandboxes
// (a second server's start once deleted the first one's namespaces), and
// a server asked to share what a live one holds refuses to start, naming
// it.
import { afterAll, describe, expect, test } from 'vitest'
import { readdirSync, rmSync } from 'node:fs'
import { Sandbox } from 'e2b'
import { startWarren, killAll, newDataDir } from '../setup/start-warren.mjs'

const servers = []
afterAll(async () => {
  rmSync(dirC, { recursive: true, force: true })
  for (const w of servers) {
    await killAll(w).catch(() => {})
    await w.stop({ removeDataDir: true })
  }
})

// Fixed data dirs: fixed derived run dirs (runsc keeps a mount there).
const dirA = '/tmp/warren-e2e-two-a'
const dirB = '/tmp/warren-e2e-two-b'
const dirC = '/tmp/warren-e2e-two-c'

const opts = (w) => ({ apiUrl: w.apiUrl, sandboxUrl: w.sandboxUrl, apiKey: w.apiKey })

// settings reads what a server claimed from its log line.
function settings(w) {
  const line = w.output().split('\n').find((l) => l.includes('host settings claimed'))
  const get = (k) => line?.match(new RegExp(`${k}=(\\S+)`))?.[1]
  return { prefix: get('network_prefix'), cidr: get('network_cidr'), runDir: get('run_dir'), cgroup: get('cgroup_parent') }
}

const netns = (prefix) => readdirSync('/run/netns').filter((n) => n.startsWith(`${prefix}-`))

// refused starts a server that must not start, and returns its output.
async function refused(args) {
  const err = await startWarren({ poolSize: 0, timeoutMs: 30_000, ...args }).then(
    (w) => { servers.push(w); return null },
    (e) => e)
  expect(err, 'the server started').not.toBeNull()
  expect(err.message).toContain('exited during start')
  return err.message
}

describe('two servers on one host', () => {
  let a, b, sa, sb
  // A's network namespaces (its sandbox's and its ready pool's) once its
  // sandbox runs: B's start and the refused starts must leave every one.
  let nsA
  test('each derives its own settings and keeps its own sandboxes', async () => {
    a = await startWarren({ dataDir: newDataDir(dirA), derived: true, poolSize: 0 })
    servers.push(a)
    sa = await Sandbox.create(opts(a))
    await sa.commands.run('sleep 600', { background: true })
    nsA = netns(settings(a).prefix)
    expect(nsA.length).toBeGreaterThan(0)

    // The second server starts while the first one's sandbox runs.
    b = await startWarren({ dataDir: newDataDir(dirB), derived: true, poolSize: 0 })
    servers.push(b)
    sb = await Sandbox.create(opts(b))

    const [ka, kb] = [settings(a), settings(b)]
    for (const k of ['prefix', 'cidr', 'runDir', 'cgroup']) {
      expect(ka[k], k).toBeTruthy()
      expect(ka[k], k).not.toBe(kb[k])
    }
    expect(ka.prefix).toMatch(/^x[a-z0-9]{4}$/)
    expect(ka.runDir).toBe(`/run/warren-${ka.prefix.slice(1)}`)
    expect(netns(ka.prefix)).toEqual(expect.arrayContaining(nsA))
    expect(netns(kb.prefix).length).toBeGreaterThan(0)

    // Both work, and A's process is still there.
    expect((await sa.commands.run('pgrep -x sleep')).stdout.trim()).not.toBe('')
    expect((await sb.commands.run('echo b')).stdout).toBe('b\n')
  })

  test('a server refuses what a live one holds, and names it', async () => {
    const ka = settings(a)
    const fresh = () => newDataDir(dirC)
    let out = await refused({ dataDir: fresh(), derived: true, extraArgs: ['--network-prefix', ka.prefix] })
    expect(out).toContain(`--network-prefix ${ka.prefix} is in use by another warren serve (pid ${a.pid}, data dir ${dirA})`)
    out = await refused({ dataDir: fresh(), derived: true, extraArgs: ['--network-cidr', ka.cidr] })
    expect(out).toContain(`--network-cidr ${ka.cidr} is in use by another warren serve (pid ${a.pid}`)
    out = await refused({ dataDir: fresh(), derived: true, extraArgs: ['--run-dir', ka.runDir] })
    expect(out).toContain(`--run-dir ${ka.runDir} is in use`)
    out = await refused({ dataDir: fresh(), derived: true, extraArgs: ['--cgroup-parent', ka.cgroup] })
    expect(out).toContain(`--cgroup-parent ${ka.cgroup} is in use`)
    // Not the same data dir either.
    out = await refused({ dataDir: dirA, derived: true })
    expect(out).toContain(`--data-dir ${dirA} is in use`)
    // A range overlapping the other's, under another name.
    const [, x] = ka.cidr.match(/^10\.(\d+)\./)
    out = await refused({ dataDir: fresh(), derived: true, extraArgs: ['--network-cidr', `10.${x}.128.0/17`] })
    expect(out).toContain('choose another range with --network-cidr')

    // None of that touched A.
    expect(netns(ka.prefix)).toEqual(expect.arrayContaining(nsA))
    expect((await sa.commands.run('pgrep -x sleep')).stdout.trim()).not.toBe('')
  })

  test("a restart of one server leaves the other's sandboxes alone", async () => {
    const kb = settings(b)
    await b.stop()
    servers.splice(servers.indexOf(b), 1)
    b = await startWarren({ dataDir: dirB, derived: true, poolSize: 0 })
    servers.push(b)
    expect(settings(b)).toEqual(kb)
    const again = await Sandbox.connect(sb.sandboxId, opts(b))
    expect((await again.commands.run('echo again')).stdout).toBe('again\n')
    expect((await sa.commands.run('pgrep -x sleep')).stdout.trim()).not.toBe('')

    expect(netns(settings(a).prefix)).toEqual(expect.arrayContaining(nsA))

    // Each cleans up only its own: once both are killed and both servers
    // stopped, neither prefix has anything left.
    const ka = settings(a)
    expect(await Sandbox.kill(sa.sandboxId, opts(a))).toBe(true)
    expect(await Sandbox.kill(sb.sandboxId, opts(b))).toBe(true)
    for (const w of [a, b]) await w.stop()
    expect(netns(ka.prefix)).toEqual([])
    expect(netns(kb.prefix)).toEqual([])
  })
})
