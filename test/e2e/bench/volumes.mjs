// Benchmarks team volumes through the official SDK against a real
// `warren serve` (runsc, pool 0): sequential write and read inside a
// sandbox on a volume and on its root filesystem, the same through the
// volume content API, and Sandbox.create with 0, 1 and 4 volume mounts.
// Run by `make bench`; prints one table. Loops are bounded in count and
// time.
import { rmSync } from 'node:fs'
import { Sandbox, Volume } from 'e2b'
import { startWarren, killAll, unmountBelow } from '../setup/start-warren.mjs'
import { measure, Table } from './stats.mjs'

const table = new Table()
const MiB = 1 << 20

const w = await startWarren({ instance: 'vbn', net16: 132, poolSize: 0 })
const conn = { apiUrl: w.apiUrl, sandboxUrl: w.sandboxUrl, apiKey: w.apiKey }
const volConn = { apiUrl: w.apiUrl } // the content API is on the API's address
try {
  await inSandbox()
  await throughTheAPI()
  await creates()
} finally {
  await killAll(w).catch(() => {})
  for (const v of await Volume.list(conn).catch(() => [])) await Volume.destroy(v.volumeId, conn).catch(() => {})
  await w.stop()
  const problems = w.output().split('\n').filter((l) => /level=(WARN|ERROR)/.test(l))
  if (problems.length) console.error(problems.join('\n'))
  unmountBelow(w.dataDir)
  rmSync(w.dataDir, { recursive: true, force: true })
}
table.print()

// dd runs dd in the sandbox and returns its throughput in MB/s (10^6
// bytes, as dd prints), from dd's own timing.
async function dd(sbx, args) {
  const r = await sbx.commands.run(`dd ${args} 2>&1 | tail -1`, { timeoutMs: 300_000, user: 'root' })
  const m = r.stdout.match(/^(\d+) bytes .* copied, ([\d.]+) s/)
  if (!m) throw new Error(`dd ${args}: ${r.stdout}`)
  return Number(m[1]) / Number(m[2]) / 1e6
}

// The sandbox's own disk is 1 GiB (diskSizeMB), so the comparison with
// its root filesystem writes 512 MiB to each; the volume also takes a
// whole GiB. Writes end with fsync (conv=fsync); reads follow the write
// (the host's page cache is warm, as it is for any file just written).
async function inSandbox() {
  const vol = await Volume.create('bench-seq', conn)
  const sbx = await Sandbox.create({ ...conn, volumeMounts: { '/data': vol }, timeoutMs: 600_000 })
  const runs = {}
  const add = (k, v) => { (runs[k] ||= []).push(v) }
  for (let i = 0; i < 3; i++) {
    for (const [where, file] of [['root filesystem', '/tmp/seq'], ['volume', '/data/seq']]) {
      add(`${where} write 512 MiB`, await dd(sbx, `if=/dev/zero of=${file} bs=1M count=512 conv=fsync`))
      add(`${where} read 512 MiB`, await dd(sbx, `if=${file} of=/dev/null bs=1M`))
      await sbx.commands.run(`rm -f ${file}`, { user: 'root' })
    }
    add('volume write 1 GiB', await dd(sbx, 'if=/dev/zero of=/data/big bs=1M count=1024 conv=fsync'))
    add('volume read 1 GiB', await dd(sbx, 'if=/data/big of=/dev/null bs=1M'))
    await sbx.commands.run('rm -f /data/big', { user: 'root' })
  }
  for (const op of ['write 512 MiB', 'read 512 MiB']) {
    table.throughput(`in a sandbox (runsc), root filesystem, ${op}`, runs[`root filesystem ${op}`])
    table.throughput(`in a sandbox (runsc), volume, ${op}`, runs[`volume ${op}`], '≥ 50 % of the root filesystem\'s')
  }
  table.throughput('in a sandbox (runsc), volume, write 1 GiB', runs['volume write 1 GiB'])
  table.throughput('in a sandbox (runsc), volume, read 1 GiB', runs['volume read 1 GiB'])
  await sbx.kill()
  await Volume.destroy(vol.volumeId, conn)
}

// zeros is a stream of n bytes of zeros in 1 MiB chunks.
function zeros(n) {
  const chunk = new Uint8Array(MiB)
  let left = n
  return new ReadableStream({
    pull(c) {
      if (left <= 0) return c.close()
      const k = Math.min(left, chunk.length)
      c.enqueue(k === chunk.length ? chunk : chunk.subarray(0, k))
      left -= k
    },
  })
}

async function throughTheAPI() {
  const vol = await Volume.create('bench-api', conn)
  const writes = await measure(async () => {
    const t0 = performance.now()
    const e = await vol.writeFile('/big', zeros(1024 * MiB), { ...volConn, force: true })
    if (e.size !== 1024 * MiB) throw new Error(`wrote ${e.size}`)
    return (1024 * MiB) / ((performance.now() - t0) / 1000) / 1e6
  }, { n: 3, warmup: 0, sample: true, budgetMs: 300_000 })
  const reads = await measure(async () => {
    const t0 = performance.now()
    let n = 0
    for await (const c of await vol.readFile('/big', { ...volConn, format: 'stream' })) n += c.length
    if (n !== 1024 * MiB) throw new Error(`read ${n}`)
    return n / ((performance.now() - t0) / 1000) / 1e6
  }, { n: 3, warmup: 0, sample: true, budgetMs: 300_000 })
  table.throughput('content API (SDK, loopback), writeFile 1 GiB', writes)
  table.throughput('content API (SDK, loopback), readFile 1 GiB (stream)', reads)
  await Volume.destroy(vol.volumeId, conn)
}

// Cold creates (no warm pool: a create with volumes never takes a warm
// sandbox), the three kinds interleaved so that drift hits them alike.
async function creates() {
  const vols = []
  for (let i = 0; i < 4; i++) vols.push(await Volume.create(`bench-mount-${i}`, conn))
  const kinds = {
    '0 volume mounts': {},
    '1 volume mount': { '/v0': vols[0] },
    '4 volume mounts': Object.fromEntries(vols.map((v, i) => [`/v${i}`, v])),
  }
  const samples = Object.fromEntries(Object.keys(kinds).map((k) => [k, []]))
  const deadline = Date.now() + 180_000
  for (let i = 0; i < 22 && Date.now() < deadline; i++) {
    for (const [k, mounts] of Object.entries(kinds)) {
      const t0 = performance.now()
      const sbx = await Sandbox.create({ ...conn, volumeMounts: mounts })
      const ms = performance.now() - t0
      await sbx.kill()
      if (i >= 2) samples[k].push(ms) // two rounds of warm-up
    }
  }
  for (const [k, s] of Object.entries(samples)) {
    table.latency(`Sandbox.create, cold (runsc), ${k}`, s.sort((a, b) => a - b), k === '0 volume mounts' ? '' : '≤ 5 ms more per mount')
  }
  for (const v of vols) await Volume.destroy(v.volumeId, conn)
}
