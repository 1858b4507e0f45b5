// The chaos run (make chaos; a short one in make test through
// platform/chaos.test.mjs): a cluster on this machine (a PostgreSQL of
// its own, two api processes, two nodes) under a steady, bounded mixed
// load through the official SDK (creates, commands, file writes,
// pause/resume, forks, volume writes, egress policy updates and, in the
// long run, template builds; a webhook receives the lifecycle events)
// while a fault schedule runs: kill -9
// and restart of a node, of an api, of PostgreSQL (pg_ctl stop -m
// immediate); the api↔node link cut and healed (an nftables drop on the
// node's internal port, in a table of the run's own); a runsc sandbox
// process killed from the host. After each fault, and at the end, the
// invariants are checked and printed as a table (docs/chaos.md).
//
// Usage: node chaos/chaos.mjs [--duration SECONDS] [--every SECONDS]
// (default 120 s, a fault every 20 s). It exits 1 on any violation.
import { execFileSync, spawnSync } from 'node:child_process'
import http from 'node:http'
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, statfsSync, unlinkSync, writeFileSync } from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { Sandbox, Template, Volume } from 'e2b'
import { startCluster } from '../setup/start-cluster.mjs'
import { newDataDir, unmountBelow } from '../setup/start-warren.mjs'
import { ownerRecord, startPostgres } from './postgres.mjs'

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))
const now = () => Date.now()

// The fault schedule, in order, round and round.
export const faults = ['kill-node', 'cut-link', 'kill-api', 'kill-runsc', 'fill-disk', 'skew-clock', 'kill-postgres']

// skew-clock restarts a node with its cluster clock this far ahead
// (WARREN_TEST_CLOCK_OFFSET: its signatures, their checks and its
// heartbeat times; the host's clock untouched), beyond the cluster
// authentication's 60 s window, for skewForS seconds.
const skew = '90s'
const skewForS = 8

// Each node's data dir is on a file system of its own (ext4 in a sparse
// image, loop-mounted), so that filling it to the reserve (fill-disk)
// fills only it, never the machine's disk other runs share.
const diskMB = 6144
const reserveMB = 1024
function nodeDisk() {
  const mount = mkdtempSync(path.join(os.tmpdir(), 'warren-chaos-disk-'))
  const image = `${mount}.img`
  execFileSync('truncate', ['-s', `${diskMB}M`, image])
  execFileSync('mkfs.ext4', ['-q', '-F', '-m', '0', image])
  execFileSync('mount', ['-o', 'loop', image, mount])
  // scripts/sweep-test-leftovers.sh removes it if this run is killed.
  writeFileSync(path.join(mount, 'owner'), ownerRecord())
  return { mount, image, dataDir: newDataDir(path.join(mount, 'data')) }
}
function removeDisk(d) {
  unmountBelow(d.mount)
  rmSync(d.mount, { recursive: true, force: true })
  rmSync(d.image, { force: true })
}

// runChaos runs the load and the faults for durationS seconds, a fault
// every everyS seconds, and returns the invariants' rows and the load's
// counts. log prints progress.
//
// builds adds template builds to the load (each ≈ 10 s of a node's CPU;
// the short run in make test leaves them out).
export async function runChaos({ durationS = 120, everyS = 20, schedule = faults, workers = 3, maxLive = 6, builds = false, log = console.log, nodeNets = { ka: 164, kb: 165 } } = {}) {
  const pg = startPostgres()
  const table = `warren_chaos_${process.pid}`
  let c
  let stopLoad = false
  const loads = []
  const results = [] // { after, invariant, ok, detail }
  const stats = { ops: {}, errors: {}, fivexx: [], timeline: [], faulted: {} }
  const faultLog = [] // { fault, target, start, end }
  const disks = {} // node -> { mount, image, dataDir }
  // The webhook's receiver: every delivery, by event type and sandbox.
  const deliveries = []
  const receiver = http.createServer((req, res) => {
    let raw = ''
    req.on('data', (d) => { if (raw.length < 1 << 16) raw += d })
    req.on('end', () => {
      try { deliveries.push(JSON.parse(raw)) } catch {}
      res.writeHead(200).end()
    })
  })
  await new Promise((r) => receiver.listen(0, '127.0.0.1', r))
  try {
    for (const n of Object.keys(nodeNets)) disks[n] = nodeDisk()
    const nodes = Object.fromEntries(Object.entries(nodeNets).map(([n, net16]) => [n, { prefix: `wk${n}`, net16, dataDir: disks[n].dataDir }]))
    c = await startCluster({ nodes, apis: 2, poolSize: 0, nodeArgs: ['--disk-reserve-mb', String(reserveMB)], extraArgs: ['--webhook-allow-cidr', '127.0.0.0/8'], pg: { host: pg.host, user: 'postgres' } })
    const names = Object.keys(c.nodes)
    const optsOf = (i) => ({ ...c.apis[i % c.apis.length].opts, requestTimeoutMs: 30_000 })
    const api = async (i, method, path, body) => {
      const a = c.apis[i % c.apis.length].opts
      const headers = { 'X-API-Key': a.apiKey }
      if (body) headers['Content-Type'] = 'application/json'
      const res = await fetch(`${a.apiUrl}${path}`, { method, headers, body: body && JSON.stringify(body), signal: AbortSignal.timeout(30_000) })
      return { status: res.status, body: await res.text() }
    }
    const vol = await Volume.create(`chaos-${process.pid}`, optsOf(0))
    const hook = await api(0, 'POST', '/events/webhooks', {
      name: 'chaos', url: `http://127.0.0.1:${receiver.address().port}/`, enabled: true,
      events: ['sandbox.lifecycle.created', 'sandbox.lifecycle.killed'], signatureSecret: 'chaos-secret',
    })
    if (hook.status !== 201) throw new Error(`registering the webhook: ${hook.status} ${hook.body}`)
    // Built templates, acknowledged: name -> the word the build wrote.
    const built = new Map()
    let building = false
    // The egress policies the load sets in turn (198.18.0.0/15: the
    // documentation range of the machine's test hosts; nothing leaves).
    const policies = [{ denyOut: ['198.18.0.0/15'] }, { allowOut: ['198.18.1.1'], denyOut: ['0.0.0.0/0'] }, {}]

    // What the load was told succeeded (acknowledged), per sandbox.
    const sbx = new Map() // id -> { id, node, state: 'running'|'paused'|'killed'|'lost', files: Map, faulted }
    const volumeFiles = new Map() // path -> content, acknowledged
    let seq = 0
    const count = (m, k) => { m[k] = (m[k] || 0) + 1 }
    const note = (op, err) => {
      count(stats.ops, op)
      if (!err) return
      const msg = String(err?.message || err).slice(0, 160)
      stats.timeline.push({ at: now(), op, msg })
      count(stats.errors, `${op}: ${msg.replace(/[0-9a-z]{20}/g, '<id>').replace(/request [0-9a-f]{16}/g, 'request <id>')}`)
      if (/^5\d\d|: 5\d\d|status 5\d\d/.test(msg)) stats.fivexx.push({ at: now(), op, msg })
    }
    const live = () => [...sbx.values()].filter((s) => s.state === 'running' && !s.faulted)
    const paused = () => [...sbx.values()].filter((s) => s.state === 'paused' && !s.faulted)
    const pick = (xs) => xs[Math.floor(Math.random() * xs.length)]
    // One operation at a time on a sandbox: what was acknowledged before
    // a pause or a fork is then exactly what it must keep.
    const withFree = async (xs, f) => {
      const s = pick(xs.filter((x) => !x.busy))
      if (!s) return
      s.busy = true
      try { return await f(s) } finally { s.busy = false }
    }

    const ops = {
      async create(i) {
        if (live().length + paused().length >= maxLive) return ops.kill(i)
        const s = await Sandbox.create({ ...optsOf(i), timeoutMs: 30 * 60_000, volumeMounts: { '/data': vol } })
        sbx.set(s.sandboxId, { id: s.sandboxId, node: c.nodeOf(s.sandboxId), state: 'running', files: new Map(), handle: s, created: true })
      },
      egress: (i) => withFree(live(), async (s) => {
        const policy = pick(policies)
        await Sandbox.updateNetwork(s.id, policy, optsOf(i))
        s.network = policy
      }),
      async build(i) {
        if (!builds || building) return ops.command(i)
        building = true
        try {
          const name = `chaos-${process.pid}-${++seq}`
          const word = `built-${seq}-${now()}`
          await Template.build(Template().fromTemplate('base').runCmd(`echo ${word} > /home/user/built.txt`), name, { ...optsOf(i), cpuCount: 1, memoryMB: 512 })
          built.set(name, word)
          // The oldest go (a delete under faults is load too); the end
          // starts the last few.
          for (const old of [...built.keys()].slice(0, -4)) {
            const r = await api(i, 'DELETE', `/templates/${old}`)
            if (r.status >= 300) throw new Error(`deleting template ${old}: ${r.status} ${r.body.slice(0, 80)}`)
            built.delete(old)
          }
        } finally {
          building = false
        }
      },
      command: (i) => withFree(live(), async (s) => {
        const r = await (await Sandbox.connect(s.id, optsOf(i))).commands.run('echo ok')
        if (r.stdout !== 'ok\n') throw new Error(`command answered ${JSON.stringify(r.stdout)}`)
      }),
      file: (i) => withFree(live(), async (s) => {
        const path = `/home/user/f${++seq}`
        const body = `${s.id} ${seq} ${now()}`
        await (await Sandbox.connect(s.id, optsOf(i))).files.write(path, body)
        s.files.set(path, body)
      }),
      volume: (i) => withFree(live(), async (s) => {
        const path = `/data/v${++seq}`
        const body = `${s.id} ${seq}`
        // sync: the write is acknowledged once it is on the volume's disk.
        await (await Sandbox.connect(s.id, optsOf(i))).commands.run(`printf %s '${body}' > ${path} && sync ${path}`)
        volumeFiles.set(path, body)
      }),
      pause: (i) => withFree(live(), async (s) => {
        await Sandbox.pause(s.id, optsOf(i))
        s.state = 'paused'
      }),
      resume: (i) => withFree(paused(), async (s) => {
        await Sandbox.connect(s.id, { ...optsOf(i), timeoutMs: 30 * 60_000 })
        s.state = 'running'
      }),
      fork: (i) => withFree(live(), async (s) => {
        if (live().length + paused().length >= maxLive) return
        const [child] = await (await Sandbox.connect(s.id, optsOf(i))).fork({ count: 1, timeoutMs: 30 * 60_000 })
        if (!child?.sandboxId) throw new Error(`fork answered ${JSON.stringify(child)}`)
        sbx.set(child.sandboxId, { id: child.sandboxId, node: c.nodeOf(child.sandboxId), state: 'running', files: new Map(s.files), network: s.network })
      }),
      kill: (i) => withFree([...live(), ...paused()], async (s) => {
        // false: it was gone already (a 404), removed by something the
        // load did not see, which a later check reports.
        const removed = await Sandbox.kill(s.id, optsOf(i))
        s.state = 'killed'
        if (removed) s.killAcked = true
        else stats.goneBeforeKill = [...(stats.goneBeforeKill || []), s.id]
      }),
    }
    const mix = ['create', 'create', 'command', 'command', 'file', 'file', 'volume', 'pause', 'resume', 'fork', 'kill', 'egress', 'build']
    const loadLoop = async (w) => {
      for (let i = w; !stopLoad; i += workers) {
        const op = pick(mix)
        try {
          await ops[op](i)
          note(op)
        } catch (e) {
          note(op, e)
        }
        await sleep(100)
      }
    }

    // Faults.
    const nftTable = table
    const nft = (...args) => execFileSync('nft', args, { encoding: 'utf8' })
    const sandboxProcs = (node, id) => {
      const runDir = `/run/warren-${c.nodes[node].prefix}`
      const out = []
      for (const pid of readdirSync('/proc').filter((p) => /^\d+$/.test(p))) {
        let cmd
        try { cmd = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0') } catch { continue }
        const line = cmd.join(' ')
        if (line.includes(runDir) && (id === undefined || line.includes(id))) out.push({ pid: Number(pid), cmd: cmd[0], line })
      }
      return out
    }
    const doFault = async (fault) => {
      const node = pick(names)
      const entry = { fault, target: node, start: now() }
      faultLog.push(entry)
      log(`fault: ${fault}`)
      switch (fault) {
        case 'kill-node': {
          c.nodes[node].proc.proc.kill('SIGKILL')
          await sleep(3000)
          await c.startNode(node)
          break
        }
        case 'kill-api': {
          const i = Math.floor(Math.random() * c.apis.length)
          entry.target = `api${i}`
          c.apis[i].proc.proc.kill('SIGKILL')
          await sleep(1000)
          await c.startAPI(i)
          break
        }
        case 'kill-postgres': {
          entry.target = 'postgres'
          pg.crash()
          await sleep(3000)
          pg.start()
          break
        }
        case 'cut-link': {
          const port = c.nodes[node].port
          nft('add', 'table', 'inet', nftTable)
          nft('add', 'chain', 'inet', nftTable, 'cut', '{ type filter hook input priority 0 ; policy accept ; }')
          nft('add', 'rule', 'inet', nftTable, 'cut', 'tcp', 'dport', String(port), 'drop')
          await sleep(8000)
          nft('delete', 'table', 'inet', nftTable)
          break
        }
        case 'fill-disk': {
          // Each node's disk down to half its reserve, the chosen one
          // first: while the other has room, creates go there; once both
          // are full, creates (and a pause, whose checkpoint needs disk)
          // must be refused clearly, 507 (or 503) in E2B's JSON; nothing
          // acknowledged is lost (the checks after). Removed at heal.
          const fills = []
          const fillUp = (n) => {
            const fill = path.join(c.nodes[n].dataDir, 'chaos-fill')
            const st = statfsSync(c.nodes[n].dataDir)
            const freeMB = Math.floor((st.bavail * st.bsize) / 2 ** 20)
            execFileSync('fallocate', ['-l', `${Math.max(1, freeMB - reserveMB / 2)}M`, fill])
            fills.push(fill)
          }
          const seen = {}
          const probe = async (phase, refusedOnly) => {
            for (let i = 0; i < 3; i++) {
              const r = await api(i, 'POST', '/sandboxes', { templateID: 'base', timeout: 60 })
              const id = (r.body.match(/"sandboxID":"(\w+)"/) || [])[1]
              const k = `${phase}: create ${r.status}${id ? ' on ' + c.nodeOf(id) : ''}${r.status >= 400 ? ' ' + r.body.replace(/\d+ MB/g, '<n> MB').slice(0, 100) : ''}`
              seen[k] = (seen[k] || 0) + 1
              if (id) await api(i, 'DELETE', `/sandboxes/${id}`)
              if (refusedOnly && !((r.status === 507 || r.status === 503) && /"code":5\d\d/.test(r.body))) entry.unclear = `${entry.unclear || ''}${k}; `
            }
          }
          fillUp(node)
          await probe(`${node} full`, false)
          const victim = live().find((s) => s.node === node && !s.busy)
          if (victim) {
            victim.busy = true
            const r = await api(0, 'POST', `/sandboxes/${victim.id}/pause`)
            if (r.status < 300) victim.state = 'paused'
            victim.busy = false
            seen[`${node} full: pause ${r.status} ${r.status >= 400 ? r.body.replace(/\d+ MB/g, '<n> MB').slice(0, 100) : ''}`] = 1
          }
          for (const n of names) if (n !== node) fillUp(n)
          await probe('all full', true)
          await sleep(3000)
          for (const f of fills) unlinkSync(f)
          entry.detail = Object.entries(seen).map(([k, v]) => `${v}x ${k}`).join('; ')
          entry.row = { invariant: 'full disks refuse creates clearly (507/503)', ok: !entry.unclear, detail: entry.unclear || '' }
          break
        }
        case 'skew-clock': {
          entry.detail = `+${skew} for ${skewForS} s`
          await c.nodes[node].proc.stop()
          await c.startNode(node, { WARREN_TEST_CLOCK_OFFSET: skew })
          await sleep(skewForS * 1000)
          await c.nodes[node].proc.stop()
          await c.startNode(node)
          break
        }
        case 'kill-runsc': {
          const victims = live().filter((s) => s.node === node && !s.busy)
          const s = pick(victims.length ? victims : live())
          if (!s) { entry.target = 'none'; break }
          entry.target = s.id
          // The sandbox's own process (runsc-sandbox / boot), not the gofer.
          const procs = sandboxProcs(s.node, s.id).filter((p) => p.cmd === 'runsc-sandbox')
          for (const p of procs) { try { process.kill(p.pid, 'SIGKILL') } catch {} }
          s.faulted = 'its runsc sandbox process was killed from the host'
          entry.detail = `${procs.length} processes`
          break
        }
      }
      entry.end = now()
    }

    // Invariants.
    const check = async (after, { final = false } = {}) => {
      const row = (invariant, ok, detail = '') => results.push({ after, invariant, ok, detail })
      // 1. Every acknowledged create answers, or is a clear 404.
      let bad = []
      for (const s of sbx.values()) {
        if (s.state === 'killed') continue
        const r = await api(0, 'GET', `/sandboxes/${s.id}`)
        if (s.faulted) stats.faulted[s.id] = `${s.faulted}; after ${after}: GET answered ${r.status} ${(r.body.match(/"state":"\w+"/) || [r.body.slice(0, 60)])[0]}`
        if (r.status === 200) continue
        if (r.status === 404 && /"code":404/.test(r.body)) { if (!s.faulted) s.faulted = 'answered 404'; continue }
        bad.push(`${s.id}: ${r.status} ${r.body.slice(0, 80)}`)
      }
      row('acknowledged creates answer (or a clear 404)', bad.length === 0, bad.join('; '))
      // 2. No acknowledged file or pause is lost.
      bad = []
      for (const s of sbx.values()) {
        if (s.state !== 'running' || s.faulted) continue
        try {
          const h = await Sandbox.connect(s.id, optsOf(0))
          for (const [p, body] of s.files) {
            const got = await h.files.read(p)
            if (got !== body) bad.push(`${s.id}${p}: ${JSON.stringify(got).slice(0, 40)}`)
          }
        } catch (e) { bad.push(`${s.id}: ${String(e.message).slice(0, 100)}`) }
      }
      for (const s of sbx.values()) {
        if (s.state !== 'paused' || s.faulted) continue
        const r = await api(1, 'GET', `/sandboxes/${s.id}`)
        if (r.status !== 200 || !/"state":"paused"/.test(r.body)) bad.push(`${s.id} paused, answered ${r.status} ${r.body.slice(0, 60)}`)
      }
      row('no acknowledged file or pause lost', bad.length === 0, bad.join('; '))
      // The last acknowledged egress policy is the sandbox's.
      bad = []
      const listOf = (p, k) => [...(p?.[k] || [])].sort().join(',')
      for (const s of sbx.values()) {
        if (s.faulted || s.network === undefined || (s.state !== 'running' && s.state !== 'paused')) continue
        const r = await api(0, 'GET', `/sandboxes/${s.id}`)
        let got
        try { got = JSON.parse(r.body).network } catch { bad.push(`${s.id}: ${r.status} ${r.body.slice(0, 60)}`); continue }
        for (const k of ['allowOut', 'denyOut']) {
          if (listOf(got, k) !== listOf(s.network, k)) bad.push(`${s.id} ${k}: ${listOf(got, k)} want ${listOf(s.network, k)}`)
        }
      }
      row('acknowledged egress policies kept', bad.length === 0, bad.join('; '))
      // Volume writes survive (read through a running sandbox on either node).
      bad = []
      const reader = live()[0]
      if (reader) {
        try {
          const h = await Sandbox.connect(reader.id, optsOf(1))
          for (const [p, body] of volumeFiles) {
            const r = await h.commands.run(`cat ${p}`).catch((e) => ({ stdout: `error ${e.message}` }))
            if (r.stdout !== body) bad.push(`${p}: ${JSON.stringify(r.stdout).slice(0, 60)}`)
          }
        } catch (e) { bad.push(`reader ${reader.id}: ${String(e.message).slice(0, 100)}`) }
      }
      row('no acknowledged volume write lost', bad.length === 0, bad.join('; '))
      // 3. No sandbox runs twice: on one node only, and one sandbox process each.
      const placed = (known = sbx) => {
        const where = new Map()
        for (const n of names) {
          for (const p of sandboxProcs(n)) {
            if (!/runsc-sandbox/.test(p.cmd)) continue
            const id = (p.line.match(/\b[a-z0-9]{20}\b/g) || []).find((x) => known.has(x))
            if (!id) continue
            where.set(id, [...(where.get(id) || []), `${n}:${p.pid}`])
          }
        }
        return where
      }
      bad = []
      for (const [id, at] of placed()) if (at.length > 1) bad.push(`${id} on ${at.join(', ')}`)
      row('no sandbox running twice', bad.length === 0, bad.join('; '))
      // 4. Store and nodes agree: what the store says runs on a node has
      // its sandbox process there (a sandbox whose runtime was killed
      // included: each node's reconciler removes it), and no process runs
      // for a sandbox the store does not place there. The reconciler
      // passes every 5 s: a disagreement must be gone within 12 s.
      const disagreements = () => {
        const stored = c.sql(`SELECT id || ' ' || node FROM sandboxes WHERE state = 'running'`).split('\n').filter(Boolean).map((l) => l.split(' '))
        const where = placed(new Set([...sbx.keys(), ...stored.map(([id]) => id)]))
        const out = []
        for (const [id, node] of stored) {
          const at = where.get(id) || []
          if (!at.some((x) => x.startsWith(node + ':'))) out.push(`${id}: store says running on ${node}, no process there`)
        }
        const storedSet = new Set(stored.map(([id, node]) => `${id} ${node}`))
        for (const [id, at] of where) for (const x of at) if (!storedSet.has(`${id} ${x.split(':')[0]}`)) out.push(`${id}: runs on ${x}, not in the store there`)
        return out
      }
      const agreeBy = now() + 12_000
      while ((bad = disagreements()).length && now() < agreeBy) await sleep(1000)
      row('store and nodes agree', bad.length === 0, bad.join('; '))
      if (!final) return
      // 5. Every paused sandbox resumes.
      bad = []
      for (const s of paused()) {
        try {
          const h = await Sandbox.connect(s.id, optsOf(0))
          for (const [p, body] of s.files) if ((await h.files.read(p)) !== body) bad.push(`${s.id}${p} differs after resume`)
          s.state = 'running'
        } catch (e) { bad.push(`${s.id}: ${String(e.message).slice(0, 120)}`) }
      }
      row('every paused sandbox resumes', bad.length === 0, bad.join('; '))
      // 6. Every acknowledged build starts, with what its step wrote.
      bad = []
      for (const [name, word] of built) {
        try {
          const h = await Sandbox.create(name, optsOf(1))
          const got = (await h.files.read('/home/user/built.txt')).trim()
          if (got !== word) bad.push(`${name}: ${JSON.stringify(got)}`)
          await h.kill()
        } catch (e) { bad.push(`${name}: ${String(e.message).slice(0, 120)}`) }
        await api(0, 'DELETE', `/templates/${name}`)
      }
      row(`every acknowledged build starts (${built.size})`, bad.length === 0, bad.join('; '))
      // 7. The webhook got a created event for every acknowledged create
      // and a killed one for every acknowledged kill (at least once,
      // docs/conformance.md; repeats are counted, not violations).
      const want = []
      for (const s of sbx.values()) {
        if (s.created) want.push(`sandbox.lifecycle.created ${s.id}`)
        if (s.killAcked) want.push(`sandbox.lifecycle.killed ${s.id}`)
      }
      const got = () => new Set(deliveries.map((e) => `${e.type} ${e.sandboxId}`))
      const deliveredBy = now() + 30_000
      while (want.some((w) => !got().has(w)) && now() < deliveredBy) await sleep(500)
      const missing = want.filter((w) => !got().has(w))
      const ids = deliveries.map((e) => e.id)
      row(`webhook events delivered (${want.length} expected, ${ids.length - new Set(ids).size} repeats)`, missing.length === 0, missing.join('; '))
    }

    // No leaks once everything is killed and the load has stopped: first
    // with the nodes running (their pools of ready network slots aside),
    // then with the nodes stopped (SIGTERM: a node tears its pool down).
    const leaksOf = (n, { network }) => {
      const { prefix, dataDir } = c.nodes[n]
      const leaks = []
      if (network) {
        const netns = existsSync('/run/netns') ? readdirSync('/run/netns').filter((x) => x.startsWith(prefix + '-')) : []
        if (netns.length) leaks.push(`${n}: netns ${netns.join(' ')}`)
        const links = spawnSync('ip', ['-o', 'link', 'show'], { encoding: 'utf8' }).stdout.split('\n').filter((l) => l.includes(` ${prefix}`))
        if (links.length) leaks.push(`${n}: links ${links.map((l) => l.split(':')[1].trim()).join(' ')}`)
      }
      const mounts = readFileSync('/proc/self/mountinfo', 'utf8').split('\n').map((l) => l.split(' ')[4]).filter((m) => m && m.startsWith(`${dataDir}/sandboxes/`))
      if (mounts.length) leaks.push(`${n}: mounts ${mounts.join(' ')}`)
      const loops = spawnSync('losetup', ['-n', '-O', 'NAME,BACK-FILE', '-l'], { encoding: 'utf8' }).stdout.split('\n').filter((l) => l.includes(`${dataDir}/`))
      if (loops.length) leaks.push(`${n}: loops ${loops.join(' ')}`)
      // The cgroup parent, in the unified hierarchy or in each v1 controller's.
      const cgs = []
      for (const root of ['/sys/fs/cgroup', ...readdirSync('/sys/fs/cgroup').map((d) => `/sys/fs/cgroup/${d}`)]) {
        const cg = `${root}/warren-${prefix}`
        if (existsSync(cg)) cgs.push(...readdirSync(cg, { withFileTypes: true }).filter((d) => d.isDirectory()).map((d) => `${cg}/${d.name}`))
      }
      if (cgs.length) leaks.push(`${n}: cgroups ${cgs.join(' ')}`)
      const procs = sandboxProcs(n).filter((p) => /runsc/.test(p.line) && !/ serve /.test(p.line))
      if (procs.length) leaks.push(`${n}: processes ${procs.map((p) => `${p.pid}:${p.cmd}`).join(' ')}`)
      return leaks
    }
    const checkLeaks = async () => {
      const listed = JSON.parse((await api(0, 'GET', '/v2/sandboxes?limit=100')).body || '[]')
      for (const s of listed) await api(0, 'DELETE', `/sandboxes/${s.sandboxID}`)
      for (const s of sbx.values()) if (s.state !== 'killed') await api(1, 'DELETE', `/sandboxes/${s.id}`)
      await sleep(3000)
      let leaks = names.flatMap((n) => leaksOf(n, { network: false }))
      results.push({ after: 'end (load stopped, all killed)', invariant: 'no leaked mount, loop, cgroup, process', ok: leaks.length === 0, detail: leaks.join('; ') })
      for (const n of names) {
        await c.nodes[n].proc.stop()
        c.nodes[n].proc = undefined
      }
      leaks = names.flatMap((n) => leaksOf(n, { network: true }))
      results.push({ after: 'end (nodes stopped)', invariant: 'no leaked netns, veth, mount, loop, cgroup, process', ok: leaks.length === 0, detail: leaks.join('; ') })
    }

    // Run: load throughout; a fault every everyS; invariants after each.
    const started = now()
    for (let w = 0; w < workers; w++) loads.push(loadLoop(w))
    let k = 0
    while (now() - started < durationS * 1000) {
      await sleep(Math.max(0, Math.min(everyS * 1000, durationS * 1000 - (now() - started))))
      if (now() - started >= durationS * 1000) break
      const fault = schedule[k++ % schedule.length]
      await doFault(fault)
      // Settle: a restarted node heartbeats, a lost one is noticed.
      await sleep(4000)
      stopLoad = true
      await Promise.all(loads.splice(0))
      const last = faultLog.at(-1)
      if (last.row) results.push({ after: `${fault} (${last.target})`, ...last.row })
      await check(`${fault} (${last.target})`)
      stopLoad = false
      for (let w = 0; w < workers; w++) loads.push(loadLoop(w))
    }
    stopLoad = true
    await Promise.all(loads)
    await check('end', { final: true })
    await checkLeaks()
    await Volume.destroy(vol.volumeId, optsOf(0)).catch(() => {})
    await api(0, 'DELETE', `/events/webhooks/${JSON.parse(hook.body).id}`).catch(() => {})
    return { results, stats, faultLog }
  } finally {
    // The load stops before the cluster does: a create in flight would
    // otherwise outlive the kill-all of stop().
    stopLoad = true
    await Promise.all(loads.splice(0))
    try { execFileSync('nft', ['delete', 'table', 'inet', table], { stdio: 'ignore' }) } catch {}
    await c?.stop().catch((e) => log(`stopping the cluster: ${e.message}`))
    for (const d of Object.values(disks)) removeDisk(d)
    pg.stop()
    receiver.closeAllConnections()
    receiver.close()
  }
}

// printTable prints the invariants and the load's counts.
export function report({ results, stats, faultLog }, log = console.log) {
  log('\nFaults:')
  for (const f of faultLog) log(`  ${f.fault.padEnd(14)} ${String(f.target).padEnd(22)} ${((f.end - f.start) / 1000).toFixed(1)} s ${f.detail || ''}`)
  // What a client saw: the load's errors from each fault's start to 10 s
  // after its end (the settle and the checks), by kind.
  log('\nWhat the load saw around each fault (start to end + 10 s):')
  for (const f of faultLog) {
    const seen = {}
    for (const e of stats.timeline) {
      if (e.at < f.start || e.at > f.end + 10_000) continue
      const kind = e.msg.replace(/[0-9a-z]{20}/g, '<id>').replace(/127\.0\.0\.1:\d+/g, '<addr>').replace(/\d+ms/g, '<n>ms').replace(/request [0-9a-f]{16}/g, 'request <id>').slice(0, 110)
      seen[`${e.op}: ${kind}`] = (seen[`${e.op}: ${kind}`] || 0) + 1
    }
    const rows = Object.entries(seen).sort((a, b) => b[1] - a[1])
    const last = stats.timeline.filter((e) => e.at >= f.start && e.at <= f.end + 10_000).map((e) => e.at).pop()
    log(`  ${f.fault} (${f.target}): ${rows.length ? `errors until ${((last - f.start) / 1000).toFixed(1)} s after its start` : 'no errors'}`)
    for (const [k, n] of rows) log(`    x${n} ${k}`)
  }
  if (stats.goneBeforeKill?.length) log(`\nSandboxes already gone when the load killed them (404): ${stats.goneBeforeKill.join(' ')}`)
  log('\nSandboxes a fault took (their last answer):')
  for (const [id, what] of Object.entries(stats.faulted)) log(`  ${id}: ${what}`)
  log('\nInvariants:')
  log(`  ${'after'.padEnd(34)} ${'invariant'.padEnd(52)} result`)
  for (const r of results) log(`  ${r.after.padEnd(34)} ${r.invariant.padEnd(52)} ${r.ok ? 'ok' : 'VIOLATED: ' + r.detail}`)
  log('\nLoad (operations, errors):')
  for (const [op, n] of Object.entries(stats.ops)) log(`  ${op.padEnd(10)} ${n}`)
  for (const [e, n] of Object.entries(stats.errors).sort((a, b) => b[1] - a[1])) log(`  error x${n}: ${e}`)
  const violations = results.filter((r) => !r.ok).length
  log(`\n${violations} invariant violations`)
  return violations
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const arg = (name, def) => {
    const i = process.argv.indexOf(name)
    return i > 0 ? Number(process.argv[i + 1]) : def
  }
  const i = process.argv.indexOf('--faults')
  const schedule = i > 0 ? process.argv[i + 1].split(',') : faults
  // Node names, prefixes and ranges of their own (the short run in make
  // test uses ka/kb on 10.164/10.165): a long run beside make test never
  // touches its namespaces, links or cgroups.
  const out = await runChaos({ durationS: arg('--duration', 120), everyS: arg('--every', 20), schedule, builds: !process.argv.includes('--no-builds'), nodeNets: { la: 168, lb: 169 } })
  process.exit(report(out) ? 1 : 0)
}
