import { describe, test, expect, beforeAll, afterAll } from 'vitest'
import { createHash, randomBytes } from 'node:crypto'
import { Sandbox, FileNotFoundError, FileType, FilesystemEventType } from 'e2b'

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

describe('files', () => {
  test('write and read text and bytes', async () => {
    const info = await sbx.files.write(`${dir}/a.txt`, 'héllo')
    expect(info.path).toBe(`${dir}/a.txt`)
    expect(info.name).toBe('a.txt')
    expect(await sbx.files.read(`${dir}/a.txt`)).toBe('héllo')

    const bytes = new Uint8Array([0, 1, 2, 255])
    await sbx.files.write(`${dir}/b.bin`, bytes.buffer)
    expect(Array.from(await sbx.files.read(`${dir}/b.bin`, { format: 'bytes' }))).toEqual([0, 1, 2, 255])

    // Relative paths resolve against the user's home.
    const rel = `e2e-rel-${Date.now()}.txt`
    const relInfo = await sbx.files.write(rel, 'rel')
    expect(relInfo.path).toBe(`/home/user/${rel}`)
    await sbx.files.remove(rel)
  })

  test('write several files at once, with directories', async () => {
    const infos = await sbx.files.write([
      { path: `${dir}/multi/one.txt`, data: 'one' },
      { path: `${dir}/multi/deep/two.txt`, data: 'two' },
    ])
    expect(infos.map((i) => i.path).sort()).toEqual([`${dir}/multi/deep/two.txt`, `${dir}/multi/one.txt`])
    expect(await sbx.files.read(`${dir}/multi/deep/two.txt`)).toBe('two')
    const owner = await sbx.commands.run(`stat -c %U ${dir}/multi/deep ${dir}/multi/deep/two.txt`)
    expect(owner.stdout).toBe('user\nuser\n')
  })

  test('list with depth', async () => {
    await sbx.files.write(`${dir}/tree/l1/l2/f.txt`, 'x')
    const one = await sbx.files.list(`${dir}/tree`)
    expect(one.map((e) => e.name)).toEqual(['l1'])
    expect(one[0].type).toBe(FileType.DIR)
    const two = await sbx.files.list(`${dir}/tree`, { depth: 2 })
    expect(two.map((e) => e.path).sort()).toEqual([`${dir}/tree/l1`, `${dir}/tree/l1/l2`])
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

    const link = await sbx.files.getInfo(`${dir}/link`)
    expect(link.type).toBe(FileType.SYMLINK)
    expect(link.symlinkTarget).toBe(`${dir}/info.txt`)
  })

  test('makeDir, rename, remove', async () => {
    expect(await sbx.files.makeDir(`${dir}/made/deep`)).toBe(true)
    expect(await sbx.files.makeDir(`${dir}/made/deep`)).toBe(false)
    await sbx.files.write(`${dir}/made/f.txt`, 'r')
    const moved = await sbx.files.rename(`${dir}/made/f.txt`, `${dir}/moved/g.txt`)
    expect(moved.path).toBe(`${dir}/moved/g.txt`)
    expect(await sbx.files.read(`${dir}/moved/g.txt`)).toBe('r')
    await sbx.files.remove(`${dir}/made`)
    expect(await sbx.files.exists(`${dir}/made`)).toBe(false)
  })

  test('reading a missing file throws FileNotFoundError', async () => {
    await expect(sbx.files.read(`${dir}/missing.txt`)).rejects.toBeInstanceOf(FileNotFoundError)
    await expect(sbx.files.getInfo(`${dir}/missing.txt`)).rejects.toBeInstanceOf(FileNotFoundError)
    await expect(sbx.files.list(`${dir}/missing`)).rejects.toBeInstanceOf(FileNotFoundError)
  })

  test('watchDir, not recursive', async () => {
    await sbx.files.makeDir(`${dir}/w1/sub`)
    const events = []
    const h = await sbx.files.watchDir(`${dir}/w1`, (e) => events.push(e))
    await sbx.files.write(`${dir}/w1/sub/nested.txt`, 'n')
    await sbx.files.write(`${dir}/w1/top.txt`, 't')
    await waitFor(() => events.some((e) => e.name === 'top.txt' && e.type === FilesystemEventType.CREATE))
    await h.stop()
    expect(events.some((e) => e.name.includes('nested.txt'))).toBe(false)
  })

  test('watchDir, recursive', async () => {
    await sbx.files.makeDir(`${dir}/w2/sub`)
    const events = []
    const h = await sbx.files.watchDir(`${dir}/w2`, (e) => events.push(e), { recursive: true })
    await sbx.files.write(`${dir}/w2/sub/nested.txt`, 'n')
    await waitFor(() => events.some((e) => e.name === 'sub/nested.txt'))
    await h.stop()
  })

  test('50 MiB upload and download, checked by sha256', async () => {
    const data = randomBytes(50 * 1024 * 1024)
    await sbx.files.write(`${dir}/big.bin`, data.buffer.slice(data.byteOffset, data.byteOffset + data.byteLength))
    const back = await sbx.files.read(`${dir}/big.bin`, { format: 'bytes' })
    expect(back.length).toBe(data.length)
    expect(sha(back)).toBe(sha(data))
    const inside = await sbx.commands.run(`sha256sum ${dir}/big.bin`)
    expect(inside.stdout.split(' ')[0]).toBe(sha(data))
  })

})
