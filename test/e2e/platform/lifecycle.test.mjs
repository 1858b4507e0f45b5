// Pause, resume, snapshots and fork through the official SDK, as users call
// them, against a real `warren serve` (runsc): a paused sandbox is kept on
// disk (its memory checkpointed, its node resources released) and resumed
// with its processes; snapshots are templates of the team; a fork starts
// sandboxes from a running one's live state.
import { afterAll, describe, expect, inject, test } from 'vitest'
import { Sandbox, SandboxNotFoundError } from 'e2b'
import { readFileSync, existsSync } from 'node:fs'
import { startWarren, killAll } from '../setup/start-warren.mjs'

const w = inject('warren')
const made = []
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

async function create(opts = {}) {
  const sbx = await Sandbox.create(opts)
  made.push(sbx.sandboxId)
  return sbx
}

afterAll(async () => {
  for (const id of made) await Sandbox.kill(id).catch(() => {})
})

// A shell loop that counts in its own memory and writes its count and pid
// to /tmp/count on every turn.
const counterLoop = `nohup bash -c 'n=0; while true; do n=$((n+1)); echo "$n $$" > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.05; done' >/dev/null 2>&1 &`

async function count(sbx) {
  const [n, pid] = (await sbx.commands.run('cat /tmp/count')).stdout.trim().split(' ').map(Number)
  return { n, pid }
}

// countsOn reads the counter until it has gone past before (at most 5 s):
// a resumed loop ticks every 50 ms, but the first read may come before
// its first tick after the restore.
async function countsOn(sbx, before) {
  let c = await count(sbx)
  for (let i = 0; i < 50 && c.pid === before.pid && c.n <= before.n; i++) {
    await sleep(100)
    c = await count(sbx)
  }
  return c
}

async function startCounter(sbx) {
  await sbx.commands.run(counterLoop)
  await sleep(300)
  return count(sbx)
}

// cgroupMemory is what the sandbox's memory cgroup is charged on this
// host (the server of setup/warren.mjs puts it under /warren-e2e), or
// null once it has none.
function cgroupMemory(id, parent = 'warren-e2e') {
  const p = `/sys/fs/cgroup/memory/${parent}/${id}/memory.usage_in_bytes`
  return existsSync(p) ? Number(readFileSync(p, 'utf8')) : null
}

// hostProcs lists the host processes in a sandbox's cgroup (its runsc
// sentry and gofer) with their resident memory.
function hostProcs(id, parent = 'warren-e2e') {
  const p = `/sys/fs/cgroup/memory/${parent}/${id}/cgroup.procs`
  if (!existsSync(p)) return []
  return readFileSync(p, 'utf8').split('\n').filter(Boolean).map((pid) => {
    const st = existsSync(`/proc/${pid}/status`) ? readFileSync(`/proc/${pid}/status`, 'utf8') : ''
    const m = st.match(/VmRSS:\s+(\d+) kB/)
    return { pid, rssMiB: m ? Number(m[1]) / 1024 : 0 }
  })
}

// exitedOnHost: the process is gone, or a zombie its new parent (the
// host's init) has not reaped yet, which holds no memory.
function exitedOnHost(pid) {
  try {
    return /^State:\s+Z/m.test(readFileSync(`/proc/${pid}/status`, 'utf8'))
  } catch {
    return true
  }
}

function memAvailableMiB() {
  const m = readFileSync('/proc/meminfo', 'utf8').match(/MemAvailable:\s+(\d+) kB/)
  return Number(m[1]) / 1024
}

describe('pause and resume', () => {
  test('pause → paused, listed by state; a second pause is false; connect resumes the same processes, memory and files; two rounds', async () => {
    const tag = `pause-${Date.now()}`
    const sbx = await create({ metadata: { tag }, envs: { MINE: 'kept' } })
    const before = await startCounter(sbx)
    await sbx.files.write('/home/user/note.txt', 'written before the pause')

    expect(await sbx.pause()).toBe(true)
    expect((await sbx.getInfo()).state).toBe('paused')
    const paused = await Sandbox.list({ query: { metadata: { tag }, state: ['paused'] } }).nextItems()
    expect(paused.map((s) => s.sandboxId)).toEqual([sbx.sandboxId])
    const running = await Sandbox.list({ query: { metadata: { tag }, state: ['running'] } }).nextItems()
    expect(running).toEqual([])
    expect(await Sandbox.pause(sbx.sandboxId)).toBe(false)
    expect(await sbx.betaPause()).toBe(false)

    for (let round = 0; round < 2; round++) {
      if (round > 0) expect(await sbx.pause()).toBe(true)
      const again = await Sandbox.connect(sbx.sandboxId)
      expect((await again.getInfo()).state).toBe('running')
      const after = await countsOn(again, before)
      expect(after.pid).toBe(before.pid)
      expect(after.n).toBeGreaterThan(before.n)
      expect(await again.files.read('/home/user/note.txt')).toBe('written before the pause')
      expect((await again.commands.run('echo $MINE')).stdout).toBe('kept\n')
    }
  })

  test('kill while paused', async () => {
    const sbx = await create()
    expect(await sbx.pause()).toBe(true)
    expect(await Sandbox.kill(sbx.sandboxId)).toBe(true)
    await expect(Sandbox.getInfo(sbx.sandboxId)).rejects.toThrow(SandboxNotFoundError)
    await expect(Sandbox.connect(sbx.sandboxId)).rejects.toThrow(SandboxNotFoundError)
    expect(await Sandbox.kill(sbx.sandboxId)).toBe(false)
  })

  test('pause of an unknown sandbox is not found', async () => {
    await expect(Sandbox.pause('nosuchsandbox000000x')).rejects.toThrow(SandboxNotFoundError)
  })

  test('keepMemory: false keeps the files but not the processes', async () => {
    const sbx = await create()
    await startCounter(sbx)
    await sbx.files.write('/home/user/kept.txt', 'files survive')
    expect(await sbx.pause({ keepMemory: false })).toBe(true)
    const again = await Sandbox.connect(sbx.sandboxId)
    expect(await again.files.read('/home/user/kept.txt')).toBe('files survive')
    const ps = await again.commands.run('pgrep -x sleep || echo none')
    expect(ps.stdout).toBe('none\n')
  })

  test("onResume 'reboot' boots a sandbox paused with its memory anew", async () => {
    const sbx = await create()
    await startCounter(sbx)
    await sbx.files.write('/home/user/kept.txt', 'files survive')
    expect(await sbx.pause()).toBe(true)
    const again = await Sandbox.connect(sbx.sandboxId, { onResume: 'reboot' })
    expect(await again.files.read('/home/user/kept.txt')).toBe('files survive')
    expect((await again.commands.run('pgrep -x sleep || echo none')).stdout).toBe('none\n')
  })

  test('autoPause on timeout, then connect gives it a new term', async () => {
    const sbx = await create({ timeoutMs: 2_000, lifecycle: { onTimeout: 'pause' } })
    const before = await startCounter(sbx)
    const deadline = Date.now() + 20_000
    while ((await Sandbox.getInfo(sbx.sandboxId)).state !== 'paused') {
      if (Date.now() > deadline) throw new Error('not paused on timeout within 20 s')
      await sleep(200)
    }
    const info = await Sandbox.getInfo(sbx.sandboxId)
    expect(info.lifecycle.onTimeout).toBe('pause')
    const again = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 60_000 })
    const resumed = await again.getInfo()
    expect(resumed.state).toBe('running')
    expect(resumed.endAt.getTime()).toBeGreaterThan(Date.now() + 50_000)
    await sleep(2_000) // the reaper runs every second: it must not pause it again
    expect((await again.getInfo()).state).toBe('running')
    expect((await count(again)).pid).toBe(before.pid)
  })

  test('autoResume: traffic through the proxy resumes a paused sandbox', async () => {
    const sbx = await create({ lifecycle: { onTimeout: 'pause', autoResume: true } })
    await sbx.commands.run(`nohup python3 -c '
import http.server, itertools
c = itertools.count(1)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(str(next(c)).encode())
    def log_message(self, *a): pass
http.server.HTTPServer(("0.0.0.0", 8000), H).serve_forever()' >/dev/null 2>&1 &
for i in $(seq 50); do curl -s localhost:8000/ >/dev/null && break; sleep 0.1; done`)
    const get = () => fetch(`${w.sandboxUrl}/`, { headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '8000' } })
    const first = await (await get()).text()
    expect(await sbx.pause()).toBe(true)
    expect((await sbx.getInfo()).state).toBe('paused')
    const res = await get()
    expect(res.status).toBe(200)
    // The server's counter went on from its memory.
    expect(Number(await res.text())).toBe(Number(first) + 1)
    const info = await sbx.getInfo()
    expect(info.state).toBe('running')
    expect(info.endAt.getTime()).toBeGreaterThan(Date.now() + 4 * 60_000) // a traffic resume's term: 5 min
  })

  test('a paused sandbox releases its memory on the node (its cgroup, from the host)', async () => {
    const sbx = await create()
    await sbx.commands.run(`nohup python3 -c '
import time
n = 200 << 20
b = bytearray(n)
b[::4096] = b"\\x01" * ((n + 4095) // 4096)
open("/tmp/ready", "w").close()
time.sleep(86400)' >/dev/null 2>&1 &
for i in $(seq 100); do [ -e /tmp/ready ] && break; sleep 0.1; done`)
    await sleep(500)
    const charged = cgroupMemory(sbx.sandboxId)
    expect(charged).toBeGreaterThan(200 * 1024 * 1024)
    const procs = hostProcs(sbx.sandboxId)
    expect(procs.reduce((a, p) => a + p.rssMiB, 0)).toBeGreaterThan(200)
    const availBefore = memAvailableMiB()
    expect(await sbx.pause()).toBe(true)
    // The pause answers once the sandbox is saved and stopped; its
    // cgroup goes with the rest of its container right after.
    const deadline = Date.now() + 3_000
    while (cgroupMemory(sbx.sandboxId) !== null && Date.now() < deadline) await sleep(20)
    expect(cgroupMemory(sbx.sandboxId)).toBe(null)
    const freed = memAvailableMiB() - availBefore
    console.log(`pause freed: cgroup charged ${(charged / 1048576).toFixed(0)} MiB; MemAvailable +${freed.toFixed(0)} MiB`)
    // The host processes that held the memory (their resident sum was
    // checked above) are gone. The host's MemAvailable is only logged:
    // other work on the box, and the checkpoint's dirty pages in the page
    // cache until written back, move it by as much as the sandbox held.
    for (const p of procs) expect(exitedOnHost(p.pid), `host process ${p.pid} of the paused sandbox`).toBe(true)
    const again = await Sandbox.connect(sbx.sandboxId)
    expect((await again.commands.run('cat /tmp/ready && echo back')).stdout).toBe('back\n')
    expect(cgroupMemory(sbx.sandboxId)).toBeGreaterThan(200 * 1024 * 1024)
  })
})

describe('snapshots', () => {
  test('createSnapshot → create from it by ID and by name (its processes continue) → listSnapshots → deleteSnapshot twice', async () => {
    const sbx = await create({ timeoutMs: 120_000 })
    const before = await startCounter(sbx)
    await sbx.files.write('/home/user/snap.txt', 'in the snapshot')
    const endAt = (await sbx.getInfo()).endAt.getTime()

    const anon = await sbx.createSnapshot()
    expect(anon.snapshotId).toMatch(/^[a-z0-9]{20}:default$/)
    expect(anon.names).toEqual([])
    const name = `snap-${Date.now()}`
    const named = await Sandbox.createSnapshot(sbx.sandboxId, { name })
    expect(named.snapshotId).toBe(`${name}:default`)
    expect(named.names).toEqual([name])
    // The sandbox ran on, its ID and end time untouched.
    const info = await sbx.getInfo()
    expect(info.state).toBe('running')
    expect(info.endAt.getTime()).toBe(endAt)
    expect((await count(sbx)).pid).toBe(before.pid)

    for (const ref of [anon.snapshotId, name, named.snapshotId]) {
      const child = await create({ template: ref })
      expect(child.sandboxId).not.toBe(sbx.sandboxId)
      const c = await count(child)
      expect(c.pid).toBe(before.pid)
      expect(c.n).toBeGreaterThanOrEqual(before.n)
      expect(await child.files.read('/home/user/snap.txt')).toBe('in the snapshot')
      expect((await child.commands.run('hostname')).stdout).toBe(`${child.sandboxId}\n`)
      await child.kill()
    }

    const listed = await Sandbox.listSnapshots({ sandboxId: sbx.sandboxId }).nextItems()
    expect(listed.map((s) => s.snapshotId).sort()).toEqual([anon.snapshotId, named.snapshotId].sort())
    const mine = await sbx.listSnapshots().nextItems()
    expect(mine.length).toBe(2)

    expect(await Sandbox.deleteSnapshot(named.snapshotId)).toBe(true)
    expect(await Sandbox.deleteSnapshot(named.snapshotId)).toBe(false)
    expect(await Sandbox.deleteSnapshot(anon.snapshotId)).toBe(true)
    expect(await Sandbox.deleteSnapshot(anon.snapshotId)).toBe(false)
    expect(await Sandbox.listSnapshots({ sandboxId: sbx.sandboxId }).nextItems()).toEqual([])
    await expect(Sandbox.create(anon.snapshotId)).rejects.toThrow()
  })

  test('a snapshot of an unknown sandbox is not found', async () => {
    await expect(Sandbox.createSnapshot('nosuchsandbox000000x')).rejects.toThrow(SandboxNotFoundError)
  })
})

describe('fork', () => {
  test('fork count 3: the children carry the live state, differ in hostname and ID, diverge; the parent runs on', async () => {
    const parent = await create({ timeoutMs: 120_000, metadata: { role: 'parent' } })
    const before = await startCounter(parent)
    await parent.files.write('/home/user/shared.txt', 'from the parent')
    const endAt = (await parent.getInfo()).endAt.getTime()

    const children = await parent.fork({ count: 3, timeoutMs: 60_000 })
    expect(children.length).toBe(3)
    for (const c of children) {
      expect(c).toBeInstanceOf(Sandbox)
      made.push(c.sandboxId)
    }
    const ids = new Set([parent.sandboxId, ...children.map((c) => c.sandboxId)])
    expect(ids.size).toBe(4)
    for (const [i, c] of children.entries()) {
      const state = await count(c)
      expect(state.pid).toBe(before.pid)
      expect(await c.files.read('/home/user/shared.txt')).toBe('from the parent')
      expect((await c.commands.run('hostname')).stdout).toBe(`${c.sandboxId}\n`)
      const info = await c.getInfo()
      expect(info.metadata).toEqual({ role: 'parent' })
      expect(info.endAt.getTime()).toBeLessThanOrEqual(Date.now() + 61_000)
      await c.files.write('/home/user/shared.txt', `child ${i}`)
    }
    for (const [i, c] of children.entries()) {
      expect(await c.files.read('/home/user/shared.txt')).toBe(`child ${i}`)
    }
    expect(await parent.files.read('/home/user/shared.txt')).toBe('from the parent')
    const info = await parent.getInfo()
    expect(info.state).toBe('running')
    expect(info.endAt.getTime()).toBe(endAt)
    expect((await count(parent)).pid).toBe(before.pid)
  })

  test('fork of an unknown sandbox is not found', async () => {
    await expect(Sandbox.fork('nosuchsandbox000000x')).rejects.toThrow(SandboxNotFoundError)
  })
})

describe('durability', () => {
  let own
  afterAll(async () => {
    if (!own) return
    await killAll(own).catch(() => {})
    await own.stop({ removeDataDir: true })
  })

  test('a paused sandbox survives a restart of warren serve and resumes with its memory', async () => {
    own = await startWarren({ instance: 'lcy', net16: 131, poolSize: 0 })
    const dataDir = own.dataDir
    const opts = () => ({ apiUrl: own.apiUrl, sandboxUrl: own.sandboxUrl, apiKey: own.apiKey })
    const sbx = await Sandbox.create({ ...opts() })
    await sbx.commands.run(counterLoop)
    await sleep(300)
    const before = await count(sbx)
    expect(await sbx.pause()).toBe(true)

    await own.stop()
    own = await startWarren({ dataDir, instance: 'lcy', net16: 131, poolSize: 0 })

    expect((await Sandbox.getInfo(sbx.sandboxId, opts())).state).toBe('paused')
    const again = await Sandbox.connect(sbx.sandboxId, opts())
    const after = await countsOn(again, before)
    expect(after.pid).toBe(before.pid)
    expect(after.n).toBeGreaterThan(before.n)
    expect(await Sandbox.kill(sbx.sandboxId, opts())).toBe(true)
  })
})
