import { describe, test, expect, beforeAll, afterAll } from 'vitest'
import { createHash, randomBytes } from 'node:crypto'
import {
  Sandbox, FileNotFoundError, InvalidArgumentError, FileType, FilesystemEventType,
} from 'e2b'

let sbx
let dir
beforeAll(async () => {
  sbx = await Sandbox.create()
  dir = `/home/user/e2e-${Date.now()}`
  await sbx.files.makeDir(dir)
})
afterAll(async () => {
  await sbx.files.remove(dir).catch(() => {})
})

async function waitFor(cond, ms = 5000) {
  const deadline = Date.now() + ms
  while (!cond()) {
    if (Date.now() > deadline) throw new Error('condition not met in time')
    await new Promise((r) => setTimeout(r, 20))
  }
}

const sha = (buf) => createHash('sha256').update(buf).digest('hex')
const arrayBuffer = (buf) => buf.buffer.slice(buf.byteOffset, buf.byteOffset + buf.byteLength)

describe('files', () => {
  test('write and read text and bytes', async () => {
    const info = await sbx.files.write(`${dir}/a.txt`, 'héllo')
    expect(info).toEqual({ path: `${dir}/a.txt`, name: 'a.txt', type: FileType.FILE })
    expect(await sbx.files.read(`${dir}/a.txt`)).toBe('héllo')

    const bytes = new Uint8Array([0, 1, 2, 255])
    await sbx.files.write(`${dir}/b.bin`, bytes.buffer)
    expect(Array.from(await sbx.files.read(`${dir}/b.bin`, { format: 'bytes' }))).toEqual([0, 1, 2, 255])
    expect(await (await sbx.files.read(`${dir}/a.txt`, { format: 'blob' })).text()).toBe('héllo')

    await sbx.files.write(`${dir}/empty`, '')
    expect(await sbx.files.read(`${dir}/empty`)).toBe('')
  })

  test('relative and ~ paths resolve against the user\'s home', async () => {
    const rel = `e2e-rel-${Date.now()}.txt`
    expect((await sbx.files.write(rel, 'rel')).path).toBe(`/home/user/${rel}`)
    expect((await sbx.files.write(`~/${rel}`, 'tilde')).path).toBe(`/home/user/${rel}`)
    expect(await sbx.files.read(`/home/user/${rel}`)).toBe('tilde')
    await sbx.files.remove(rel)

    const asRoot = await sbx.files.write(rel, 'root', { user: 'root' })
    expect(asRoot.path).toBe(`/root/${rel}`)
    const info = await sbx.files.getInfo(rel, { user: 'root' })
    expect([info.owner, info.group]).toEqual(['root', 'root'])
    await sbx.files.remove(rel, { user: 'root' })
  })

  test('octet-stream and gzip uploads, gzip and stream downloads', async () => {
    await sbx.files.write(`${dir}/oct.txt`, 'octet', { useOctetStream: true })
    expect(await sbx.files.read(`${dir}/oct.txt`)).toBe('octet')
    const data = 'gzip me '.repeat(10_000)
    await sbx.files.write(`${dir}/gz.txt`, data, { gzip: true })
    expect(await sbx.files.read(`${dir}/gz.txt`, { gzip: true })).toBe(data)
    const stream = await sbx.files.read(`${dir}/gz.txt`, { format: 'stream' })
    let text = ''
    const dec = new TextDecoder()
    for await (const chunk of stream) text += dec.decode(chunk, { stream: true })
    expect(text).toBe(data)
  })

  test('metadata is stored with the file and replaced by the next upload', async () => {
    const info = await sbx.files.write(`${dir}/meta.txt`, 'm', { metadata: { Kind: 'report', v: '1' } })
    expect(info.metadata).toEqual({ kind: 'report', v: '1' })
    expect((await sbx.files.getInfo(`${dir}/meta.txt`)).metadata).toEqual({ kind: 'report', v: '1' })
    await sbx.files.write(`${dir}/meta.txt`, 'm2')
    expect((await sbx.files.getInfo(`${dir}/meta.txt`)).metadata).toBeUndefined()
  })

  test('write several files at once, with directories', async () => {
    const infos = await sbx.files.write([
      { path: `${dir}/multi/one.txt`, data: 'one' },
      { path: `${dir}/multi/deep/two.txt`, data: 'two' },
    ])
    expect(infos.map((i) => i.path).sort()).toEqual([`${dir}/multi/deep/two.txt`, `${dir}/multi/one.txt`])
    expect(await sbx.files.read(`${dir}/multi/one.txt`)).toBe('one')
    expect(await sbx.files.read(`${dir}/multi/deep/two.txt`)).toBe('two')
    const owner = await sbx.commands.run(`stat -c %U ${dir}/multi/deep ${dir}/multi/deep/two.txt`)
    expect(owner.stdout).toBe('user\nuser\n')
  })

  test('list with depth', async () => {
    await sbx.files.write(`${dir}/tree/l1/l2/f.txt`, 'x')
    await sbx.files.write(`${dir}/tree/top.txt`, 'x')
    const one = await sbx.files.list(`${dir}/tree`)
    expect(one.map((e) => [e.name, e.type, e.path]).sort()).toEqual([
      ['l1', FileType.DIR, `${dir}/tree/l1`],
      ['top.txt', FileType.FILE, `${dir}/tree/top.txt`],
    ])
    const two = await sbx.files.list(`${dir}/tree`, { depth: 2 })
    expect(two.map((e) => e.path).sort()).toEqual([`${dir}/tree/l1`, `${dir}/tree/l1/l2`, `${dir}/tree/top.txt`])
  })

  test('exists, getInfo with every field', async () => {
    await sbx.files.write(`${dir}/info.txt`, '12345')
    await sbx.commands.run(`chmod 640 ${dir}/info.txt && ln -s ${dir}/info.txt ${dir}/link`)
    expect(await sbx.files.exists(`${dir}/info.txt`)).toBe(true)
    expect(await sbx.files.exists(`${dir}/nope`)).toBe(false)

    const info = await sbx.files.getInfo(`${dir}/info.txt`)
    expect(info.name).toBe('info.txt')
    expect(info.type).toBe(FileType.FILE)
    expect(info.path).toBe(`${dir}/info.txt`)
    expect(info.size).toBe(5)
    expect(info.mode).toBe(0o640)
    expect(info.permissions).toBe('-rw-r-----')
    expect(info.owner).toBe('user')
    expect(info.group).toBe('user')
    expect(info.modifiedTime).toBeInstanceOf(Date)
    expect(Math.abs(info.modifiedTime.getTime() - Date.now())).toBeLessThan(60_000)
    expect(info.symlinkTarget).toBeUndefined()

    // A link reports its target's type and mode, as E2B's envd does
    // (tests/envd-details.test.mjs has the rest).
    const link = await sbx.files.getInfo(`${dir}/link`)
    expect(link.type).toBe(FileType.FILE)
    expect(link.mode).toBe(0o640)
    expect(link.symlinkTarget).toBe(`${dir}/info.txt`)

    // The permission bits only, as E2B's envd reports them.
    const d = await sbx.files.getInfo(dir)
    expect(d.type).toBe(FileType.DIR)
    expect(d.permissions).toBe('drwxr-xr-x')
    expect(d.mode).toBe(0o755)
  })

  test('makeDir, rename, remove', async () => {
    expect(await sbx.files.makeDir(`${dir}/made/deep`)).toBe(true)
    expect(await sbx.files.makeDir(`${dir}/made/deep`)).toBe(false)
    await sbx.files.write(`${dir}/made/f.txt`, 'r')
    const moved = await sbx.files.rename(`${dir}/made/f.txt`, `${dir}/moved/g.txt`)
    expect(moved.path).toBe(`${dir}/moved/g.txt`)
    expect(moved.type).toBe(FileType.FILE)
    expect(await sbx.files.read(`${dir}/moved/g.txt`)).toBe('r')
    expect(await sbx.files.exists(`${dir}/made/f.txt`)).toBe(false)
    await sbx.files.remove(`${dir}/made`)
    expect(await sbx.files.exists(`${dir}/made`)).toBe(false)
  })

  test('missing paths throw FileNotFoundError', async () => {
    await expect(sbx.files.read(`${dir}/missing.txt`)).rejects.toBeInstanceOf(FileNotFoundError)
    await expect(sbx.files.getInfo(`${dir}/missing.txt`)).rejects.toBeInstanceOf(FileNotFoundError)
    await expect(sbx.files.list(`${dir}/missing`)).rejects.toBeInstanceOf(FileNotFoundError)
    await expect(sbx.files.rename(`${dir}/missing`, `${dir}/x`)).rejects.toBeInstanceOf(FileNotFoundError)
    await expect(sbx.files.watchDir(`${dir}/missing`, () => {})).rejects.toBeInstanceOf(FileNotFoundError)
  })

  test('wrong file types throw InvalidArgumentError', async () => {
    await sbx.files.write(`${dir}/plain`, 'p')
    await expect(sbx.files.list(`${dir}/plain`)).rejects.toBeInstanceOf(InvalidArgumentError)
    await expect(sbx.files.makeDir(`${dir}/plain`)).rejects.toBeInstanceOf(InvalidArgumentError)
    await expect(sbx.files.watchDir(`${dir}/plain`, () => {})).rejects.toBeInstanceOf(InvalidArgumentError)
    await expect(sbx.files.write(dir, 'x')).rejects.toBeInstanceOf(InvalidArgumentError)
    await expect(sbx.files.read(dir)).rejects.toBeInstanceOf(InvalidArgumentError)
  })

  test('watchDir, not recursive', async () => {
    await sbx.files.makeDir(`${dir}/w1/sub`)
    const events = []
    const h = await sbx.files.watchDir(`${dir}/w1`, (e) => events.push(e))
    await sbx.files.write(`${dir}/w1/sub/nested.txt`, 'n')
    await sbx.files.write(`${dir}/w1/top.txt`, 't')
    await waitFor(() => events.some((e) => e.name === 'top.txt' && e.type === FilesystemEventType.CREATE))
    await sbx.commands.run(`rm ${dir}/w1/top.txt`)
    await waitFor(() => events.some((e) => e.name === 'top.txt' && e.type === FilesystemEventType.REMOVE))
    await h.stop()
    expect(events.some((e) => e.name.includes('nested.txt'))).toBe(false)
  })

  test('watchDir, recursive, including a directory made after the watch began', async () => {
    await sbx.files.makeDir(`${dir}/w2/sub`)
    const events = []
    const h = await sbx.files.watchDir(`${dir}/w2`, (e) => events.push(e), { recursive: true })
    await sbx.files.write(`${dir}/w2/sub/nested.txt`, 'n')
    await waitFor(() => events.some((e) => e.name === 'sub/nested.txt'))
    await sbx.files.makeDir(`${dir}/w2/later`)
    await waitFor(() => events.some((e) => e.name === 'later' && e.type === FilesystemEventType.CREATE))
    await sbx.commands.run(`echo x > ${dir}/w2/later/new.txt`)
    await waitFor(() => events.some((e) => e.name === 'later/new.txt'))
    await h.stop()
  })

  test('watchDir with includeEntry', async () => {
    await sbx.files.makeDir(`${dir}/w3`)
    const events = []
    const h = await sbx.files.watchDir(`${dir}/w3`, (e) => events.push(e), { includeEntry: true })
    await sbx.commands.run(`printf abc > ${dir}/w3/e.txt`)
    await waitFor(() => events.some((e) => e.name === 'e.txt' && e.type === FilesystemEventType.WRITE))
    await h.stop()
    const ev = events.find((e) => e.name === 'e.txt' && e.entry)
    expect(ev.entry.path).toBe(`${dir}/w3/e.txt`)
    expect(ev.entry.type).toBe(FileType.FILE)
  })

  // E2B's own SDK tests and docs watch for a WRITE event named after the file
  // that files.write overwrote; E2B's envd writes the file in place.
  test('files.write on a watched file emits WRITE for that file, and nothing for other names', async () => {
    await sbx.files.write(`${dir}/w4/f.txt`, 'before')
    const events = []
    const h = await sbx.files.watchDir(`${dir}/w4`, (e) => events.push(e))
    await sbx.files.write(`${dir}/w4/f.txt`, 'after')
    await waitFor(() => events.some((e) => e.name === 'f.txt' && e.type === FilesystemEventType.WRITE), 2000)
      .catch(() => {})
    await h.stop()
    const seen = events.map((e) => `${e.name}:${e.type}`)
    expect(seen, `events: ${seen.join(' ')}`).toContain('f.txt:write')
    expect(seen.filter((s) => !s.startsWith('f.txt:')), 'events for other names').toEqual([])
  })

  // Without a token the SDK returns unsigned URLs (signed ones: auth.test.mjs).
  test('uploadUrl and downloadUrl in debug mode', async () => {
    const form = new FormData()
    form.append('file', new Blob(['by url']), 'ignored-name')
    const up = await fetch(await sbx.uploadUrl(`${dir}/url.txt`), { method: 'POST', body: form })
    expect(up.status).toBe(200)
    const down = await fetch(await sbx.downloadUrl(`${dir}/url.txt`))
    expect(await down.text()).toBe('by url')
  })

  test('50 MiB upload and download, checked by sha256', async () => {
    const data = randomBytes(50 * 1024 * 1024)
    await sbx.files.write(`${dir}/big.bin`, arrayBuffer(data))
    const back = await sbx.files.read(`${dir}/big.bin`, { format: 'bytes' })
    expect(back.length).toBe(data.length)
    expect(sha(back)).toBe(sha(data))
    const inside = await sbx.commands.run(`sha256sum ${dir}/big.bin`)
    expect(inside.stdout.split(' ')[0]).toBe(sha(data))
  })
})
