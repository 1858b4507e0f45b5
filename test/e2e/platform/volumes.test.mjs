// Team volumes through the official SDK against a real `warren serve`
// (runsc): Volume.create/getInfo/list/connect/destroy, volumeMounts on
// Sandbox.create, sharing between sandboxes, the volume content API seen
// from inside a sandbox and back, escapes, and deletion while mounted.
import { afterAll, describe, expect, inject, test } from 'vitest'
import {
  AuthenticationError, Sandbox, SandboxError, Volume, VolumeError, VolumeNotFoundError, VolumePathNotFoundError,
} from 'e2b'

const w = inject('warren')
const sandboxes = []
const volumes = []

async function sandbox(opts = {}) {
  const sbx = await Sandbox.create(opts)
  sandboxes.push(sbx.sandboxId)
  return sbx
}

async function volume(prefix) {
  const vol = await Volume.create(uniq(prefix))
  volumes.push(vol.volumeId)
  return vol
}

function uniq(prefix) {
  return `${prefix}-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 6)}`
}

// run runs a shell command in a sandbox and returns its stdout; a failure
// throws with the command's output.
async function run(sbx, cmd, opts = {}) {
  const r = await sbx.commands.run(cmd, opts)
  return r.stdout
}

afterAll(async () => {
  for (const id of sandboxes) await Sandbox.kill(id).catch(() => {})
  for (const id of volumes) await Volume.destroy(id).catch(() => {})
})

const uuid = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/

describe('volumes', () => {
  test('create, getInfo, list, connect and destroy', async () => {
    const name = uniq('crud')
    const vol = await Volume.create(name)
    expect(vol.volumeId).toMatch(uuid)
    expect(vol.name).toBe(name)
    expect(vol.token).toMatch(/^[0-9a-f]{64}$/)
    expect(await Volume.getInfo(vol.volumeId)).toEqual({ volumeId: vol.volumeId, name, token: vol.token, domain: undefined })
    expect(await Volume.list()).toContainEqual({ volumeId: vol.volumeId, name })
    const again = await Volume.connect(vol.volumeId)
    expect(again.token).toBe(vol.token)
    expect(await again.list('/')).toEqual([])

    const taken = await Volume.create(name).catch((e) => e)
    expect(taken).toBeInstanceOf(VolumeError)
    expect(taken.message).toMatch(/^409: /)
    for (const bad of ['with space', 'a/b', '..', 'x'.repeat(251), '']) {
      const err = await Volume.create(bad).catch((e) => e)
      expect(err, bad).toBeInstanceOf(VolumeError)
      expect(err.message, bad).toMatch(/^400: /)
    }
    const badID = await Volume.getInfo('not-a-uuid').catch((e) => e)
    expect(badID.message).toMatch(/^400: /)

    expect(await Volume.destroy(vol.volumeId)).toBe(true)
    await expect(Volume.getInfo(vol.volumeId)).rejects.toThrow(VolumeNotFoundError)
    await expect(Volume.connect(vol.volumeId)).rejects.toThrow(VolumeNotFoundError)
    expect(await Volume.destroy(vol.volumeId)).toBe(false)
    expect((await Volume.list()).map((v) => v.volumeId)).not.toContain(vol.volumeId)
    // Its token opens nothing any more.
    await expect(vol.list('/')).rejects.toThrow(AuthenticationError)
  })

  test('data written in one sandbox is in the next, mounted by name elsewhere', async () => {
    const vol = await volume('handover')
    const a = await sandbox({ volumeMounts: { '/data': vol } })
    await run(a, 'echo from-a > /data/note && mkdir -p /data/sub && id -u > /data/sub/uid')
    expect((await a.getInfo()).volumeMounts).toEqual([{ name: vol.name, path: '/data' }])
    await a.kill()

    const tag = uniq('listed')
    const b = await sandbox({ volumeMounts: { '/home/user/other': vol.name }, metadata: { tag } })
    expect(await run(b, 'cat ~/other/note ~/other/sub/uid')).toBe('from-a\n1000\n')
    const listed = await Sandbox.list({ query: { metadata: { tag } } }).nextItems()
    expect(listed.map((s) => s.volumeMounts)).toEqual([[{ name: vol.name, path: '/home/user/other' }]])
  })

  test('two running sandboxes share a volume and see each other at once', async () => {
    const vol = await volume('live')
    const other = await volume('other')
    const [a, b] = await Promise.all([
      sandbox({ volumeMounts: { '/data': vol, '/more': other } }),
      sandbox({ volumeMounts: { '/shared': vol } }),
    ])
    expect((await a.getInfo()).volumeMounts).toEqual([{ name: vol.name, path: '/data' }, { name: other.name, path: '/more' }])
    await run(a, 'echo 1 > /data/x')
    expect(await run(b, 'cat /shared/x')).toBe('1\n')
    await run(b, 'echo 2 >> /shared/x')
    expect(await run(a, 'cat /data/x')).toBe('1\n2\n')
    // Both write at once, each its own file (appends to one file from two
    // gVisor sandboxes are not atomic: see docs/design/volumes.md); each
    // sees all of the other's.
    await Promise.all([
      run(a, 'for i in $(seq 200); do echo a$i >> /data/a.log; done'),
      run(b, 'for i in $(seq 200); do echo b$i >> /shared/b.log; done'),
    ])
    expect(await run(a, 'wc -l < /data/b.log; tail -1 /data/b.log')).toBe('200\nb200\n')
    expect(await run(b, 'wc -l < /shared/a.log; tail -1 /shared/a.log')).toBe('200\na200\n')
    expect(await run(b, 'ls /shared')).toBe('a.log\nb.log\nx\n')
  })

  test('the content API, seen live inside a mounted sandbox and back', async () => {
    const vol = await volume('content')
    const sbx = await sandbox({ volumeMounts: { '/data': vol } })

    const dir = await vol.makeDir('/docs/deep', { force: true })
    expect(dir).toMatchObject({ name: 'deep', path: '/docs/deep', type: 'directory', uid: 9090, gid: 9090, mode: 0o777 })
    expect(dir.mtime).toBeInstanceOf(Date)
    await expect(vol.makeDir('/docs/deep')).rejects.toThrow(/^409: /)
    await expect(vol.makeDir('/none/x')).rejects.toThrow(VolumePathNotFoundError)
    const file = await vol.writeFile('/docs/hello.txt', 'hello from the API')
    expect(file).toMatchObject({ name: 'hello.txt', type: 'file', size: 18, uid: 9090, gid: 9090, mode: 0o666 })
    expect(await run(sbx, 'cat /data/docs/hello.txt; echo; stat -c "%u:%g %a" /data/docs/hello.txt /data/docs/deep'))
      .toBe('hello from the API\n9090:9090 666\n9090:9090 777\n')
    await expect(vol.writeFile('/docs/hello.txt', 'again')).rejects.toThrow(/^409: /)
    await vol.writeFile('/docs/hello.txt', 'replaced', { force: true, mode: 0o640, uid: 1000, gid: 1000 })
    expect(await run(sbx, 'cat /data/docs/hello.txt; echo; stat -c "%u:%g %a" /data/docs/hello.txt')).toBe('replaced\n1000:1000 640\n')

    await run(sbx, 'echo from-sandbox > /data/docs/back.txt && ln -s back.txt /data/docs/link')
    expect(await vol.readFile('/docs/back.txt')).toBe('from-sandbox\n')
    expect(await vol.readFile('docs/link')).toBe('from-sandbox\n')
    const info = await vol.getInfo('/docs/back.txt')
    expect(info).toMatchObject({ type: 'file', size: 13, uid: 1000, gid: 1000, mode: 0o644 })
    expect(await vol.getInfo('/docs/link')).toMatchObject({ type: 'file', target: 'back.txt' })

    expect((await vol.list('/')).map((e) => e.path)).toEqual(['/docs'])
    expect((await vol.list('/', { depth: 2 })).map((e) => e.path))
      .toEqual(['/docs', '/docs/back.txt', '/docs/deep', '/docs/hello.txt', '/docs/link'])
    await expect(vol.list('/', { depth: 11 })).rejects.toThrow(/^400: /)
    await expect(vol.list('/docs/hello.txt')).rejects.toThrow(/^400: /)

    const upd = await vol.updateMetadata('/docs/back.txt', { uid: 1001, mode: 0o600 })
    expect(upd).toMatchObject({ uid: 1001, gid: 1000, mode: 0o600 })
    expect(await run(sbx, 'stat -c "%u:%g %a" /data/docs/back.txt')).toBe('1001:1000 600\n')

    await vol.remove('/docs/back.txt')
    await expect(vol.getInfo('/docs/back.txt')).rejects.toThrow(VolumePathNotFoundError)
    expect(await vol.exists('/docs/back.txt')).toBe(false)
    expect(await vol.exists('/docs/hello.txt')).toBe(true)
    expect(await run(sbx, 'test -e /data/docs/back.txt && echo there || echo gone')).toBe('gone\n')
    await expect(vol.readFile('/nope')).rejects.toThrow(VolumePathNotFoundError)
    await expect(vol.remove('/nope')).rejects.toThrow(VolumePathNotFoundError)
    await vol.remove('/docs')
    expect(await run(sbx, 'ls -A /data')).toBe('')

    // Bytes and streams, both ways.
    const big = Buffer.alloc(5 << 20)
    for (let i = 0; i < big.length; i += 4096) big[i] = i % 251
    await vol.writeFile('/big.bin', new Blob([big]))
    expect(await run(sbx, 'sha256sum < /data/big.bin | cut -c1-64')).toBe(
      (await import('node:crypto')).createHash('sha256').update(big).digest('hex') + '\n')
    const back = await vol.readFile('/big.bin', { format: 'bytes' })
    expect(Buffer.compare(Buffer.from(back), big)).toBe(0)
    const stream = await vol.readFile('/big.bin', { format: 'stream' })
    let n = 0
    for await (const chunk of stream) n += chunk.length
    expect(n).toBe(big.length)
  })

  test('.. and links never lead out of the volume', async () => {
    const vol = await volume('escape')
    const sbx = await sandbox({ volumeMounts: { '/data': vol } })
    for (const p of ['../../etc/passwd', '/docs/../../etc/passwd', '..']) {
      await expect(vol.readFile(p), p).rejects.toThrow(/^400: /)
      await expect(vol.list(p), p).rejects.toThrow(/^400: /)
      await expect(vol.writeFile(p, 'x', { force: true }), p).rejects.toThrow(/^400: /)
    }
    // Links the sandbox plants resolve inside the volume, where their
    // targets do not exist: neither the host's files nor the sandbox's.
    await run(sbx, 'ln -s /etc/passwd /data/abs && ln -s ../../../../../../etc/hostname /data/rel && ln -s /proc/self/environ /data/environ && ln -s / /data/root',
      { user: 'root' })
    for (const p of ['/abs', '/rel', '/environ', '/root/etc/passwd']) {
      await expect(vol.readFile(p), p).rejects.toThrow(VolumePathNotFoundError)
    }
    expect((await vol.list('/root')).map((e) => e.path)).toEqual(['/root/abs', '/root/environ', '/root/rel', '/root/root'])
    // Writing over a link replaces the link; what it named is untouched.
    await vol.writeFile('/abs', 'replaced the link', { force: true })
    expect(await run(sbx, 'test -L /data/abs || cat /data/abs; echo; head -1 /etc/passwd | cut -d: -f1')).toBe('replaced the link\nroot\n')
    // Special files the sandbox makes are never opened, nor waited on:
    // gVisor keeps a FIFO to itself and refuses mknod of a device there
    // (nothing reaches the volume: 404); a runc sandbox's land, and are
    // refused (400).
    const made = await run(sbx, '(mknod /data/mem c 1 1; mkfifo /data/fifo) 2>/dev/null; cd /data && ls mem fifo 2>/dev/null; true', { user: 'root' })
    expect(made).toContain('fifo')
    for (const name of made.trim().split('\n')) {
      await expect(vol.readFile('/' + name), name).rejects.toThrow(/^(400: .*not a regular file|Path \/\w+ not found)/)
    }
  })

  test('a volume that sandboxes mount is not deleted', async () => {
    const vol = await volume('busy')
    const sbx = await sandbox({ volumeMounts: { '/data': vol } })
    await run(sbx, 'echo keep > /data/f')
    const err = await Volume.destroy(vol.volumeId).catch((e) => e)
    expect(err).toBeInstanceOf(VolumeError)
    expect(err.message).toMatch(/^409: /)
    expect(err.message).toContain(sbx.sandboxId)
    expect(await vol.readFile('/f')).toBe('keep\n')
    await sbx.kill()
    expect(await Volume.destroy(vol.volumeId)).toBe(true)
  })

  test('bad mount paths and unknown volumes are refused before anything starts', async () => {
    const vol = await volume('paths')
    const tag = uniq('refused')
    for (const p of ['relative', '/', '/proc/x', '/sys', '/dev/shm', '/opt/warren', '/etc', '/data/../etc', '/data/']) {
      const err = await Sandbox.create({ volumeMounts: { [p]: vol }, metadata: { tag } }).catch((e) => e)
      expect(err, p).toBeInstanceOf(SandboxError)
      expect(err.message, p).toMatch(/^400: /)
    }
    const nested = await Sandbox.create({ volumeMounts: { '/a': vol, '/a/b': vol }, metadata: { tag } }).catch((e) => e)
    expect(nested.message).toMatch(/^400: /)
    const unknown = await Sandbox.create({ volumeMounts: { '/data': 'no-such-volume' }, metadata: { tag } }).catch((e) => e)
    expect(unknown).toBeInstanceOf(SandboxError)
    expect(unknown.message).toMatch(/^404: .*no-such-volume/)
    // The same path twice can only be sent by hand (the SDK keys by path).
    const res = await fetch(`${w.apiUrl}/v2/sandboxes`, {
      method: 'POST', headers: { 'X-API-Key': w.apiKey, 'Content-Type': 'application/json' },
      body: JSON.stringify({ templateID: 'base', metadata: { tag }, volumeMounts: [{ name: vol.name, path: '/a' }, { name: vol.name, path: '/a' }] }),
    })
    expect(res.status).toBe(400)
    expect(await Sandbox.list({ query: { metadata: { tag } } }).nextItems()).toEqual([])
  })

  test('a volume survives pause and resume', async () => {
    const vol = await volume('pause')
    const sbx = await sandbox({ volumeMounts: { '/data': vol }, lifecycle: { onTimeout: 'pause' }, timeoutMs: 4000 })
    await run(sbx, 'echo before > /data/p')
    const deadline = Date.now() + 20_000
    while ((await sbx.getInfo()).state !== 'paused') {
      if (Date.now() > deadline) throw new Error('the sandbox did not pause')
      await new Promise((r) => setTimeout(r, 250))
    }
    await vol.writeFile('/while-paused', 'written while paused')
    const again = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 60_000 })
    expect(await run(again, 'cat /data/p /data/while-paused; echo; echo after >> /data/p')).toBe('before\nwritten while paused\n')
    expect(await vol.readFile('/p')).toBe('before\nafter\n')
    expect((await again.getInfo()).volumeMounts).toEqual([{ name: vol.name, path: '/data' }])
  })

  test('pause() keeps the mount; the paused sandbox holds the volume', async () => {
    const vol = await volume('paused')
    const sbx = await sandbox({ volumeMounts: { '/data': vol }, timeoutMs: 60_000 })
    // A process keeps a file of the volume open across the pause.
    await sbx.commands.run('exec 3>>/data/held; echo one >&3; sleep 600', { background: true })
    await waitFor(async () => (await vol.readFile('/held')) === 'one\n')
    expect(await sbx.pause()).toBe(true)
    const err = await Volume.destroy(vol.volumeId).catch((e) => e)
    expect(err).toBeInstanceOf(VolumeError)
    expect(err.message).toMatch(/^409: /)
    expect(err.message).toContain(sbx.sandboxId)
    await vol.writeFile('/while-paused', 'new')
    await Sandbox.connect(sbx.sandboxId, { timeoutMs: 60_000 })
    expect(await run(sbx, 'cat /data/while-paused; echo; echo two >> /data/held; cat /data/held')).toBe('new\none\ntwo\n')
    expect((await sbx.getInfo()).volumeMounts).toEqual([{ name: vol.name, path: '/data' }])
  })

  test('a snapshot references its volumes (no copy); sandboxes made from it and forks mount them', async () => {
    const vol = await volume('snap')
    const other = await volume('snap-other')
    const parent = await sandbox({ volumeMounts: { '/data': vol }, timeoutMs: 120_000 })
    await run(parent, 'echo before > /data/f')
    const snap = await parent.createSnapshot()
    // Written after the snapshot: a copy would not have it.
    await vol.writeFile('/after', 'after the snapshot')

    const child = await sandbox({ template: snap.snapshotId })
    expect((await child.getInfo()).volumeMounts).toEqual([{ name: vol.name, path: '/data' }])
    expect(await run(child, 'cat /data/f /data/after; echo; echo child > /data/from-child')).toBe('before\nafter the snapshot\n')
    expect(await run(parent, 'cat /data/from-child')).toBe('child\n')
    // A restore has the checkpoint's mounts and no others.
    await expect(Sandbox.create(snap.snapshotId, { volumeMounts: { '/more': other } })).rejects.toThrow(/mount the volumes it was taken with/)

    const forks = await parent.fork({ count: 2, timeoutMs: 60_000 })
    for (const f of forks) sandboxes.push(f.sandboxId)
    for (const [i, f] of forks.entries()) {
      expect((await f.getInfo()).volumeMounts).toEqual([{ name: vol.name, path: '/data' }])
      await run(f, `echo fork${i} > /data/fork${i}`)
    }
    expect(await run(parent, 'cat /data/fork0 /data/fork1')).toBe('fork0\nfork1\n')
    const err = await Volume.destroy(vol.volumeId).catch((e) => e)
    expect(err.message).toMatch(/^409: /)
    for (const id of [forks[0].sandboxId, forks[1].sandboxId, child.sandboxId, parent.sandboxId]) {
      expect(err.message).toContain(id)
      await Sandbox.kill(id)
    }
    // The volume goes; the snapshot that references it makes no sandbox.
    expect(await Volume.destroy(vol.volumeId)).toBe(true)
    await expect(Sandbox.create(snap.snapshotId)).rejects.toThrow(/volume/)
    await Sandbox.deleteSnapshot(snap.snapshotId)
  })
})

async function waitFor(cond, ms = 10_000) {
  const deadline = Date.now() + ms
  while (!(await cond().catch(() => false))) {
    if (Date.now() > deadline) throw new Error('timed out waiting')
    await new Promise((r) => setTimeout(r, 200))
  }
}
