// Benchmarks envd through the official SDK (debug mode: localhost:49983).
// Run by `make bench`; prints one table. Every loop is bounded in count and time.
import { randomBytes } from 'node:crypto'
import { Sandbox } from 'e2b'
import { startEnvd } from '../setup/start-envd.mjs'
import { measure, Table } from './stats.mjs'

process.env.E2B_DEBUG = 'true'
const envd = await startEnvd()
try {
  const sbx = await Sandbox.create()
  const table = new Table()
  const dir = `/tmp/warren-bench-${process.pid}`
  await sbx.files.makeDir(dir)

  table.latency('commands.run("true") round trip', await measure(() => sbx.commands.run('true'), { n: 200 }), 'p50 ≤ 3 ms')

  table.latency('Start → first stdout byte', await firstByte(sbx))

  const mib = randomBytes(1 << 20)
  const mibBuf = mib.buffer.slice(mib.byteOffset, mib.byteOffset + mib.byteLength)
  table.latency('files.write 1 MiB', await measure(() => sbx.files.write(`${dir}/1m`, mibBuf), { n: 50 }))
  table.latency('files.read 1 MiB', await measure(() => sbx.files.read(`${dir}/1m`, { format: 'bytes' }), { n: 50 }))

  const big = randomBytes(50 << 20)
  const bigBuf = big.buffer.slice(big.byteOffset, big.byteOffset + big.byteLength)
  const up = await measure(() => sbx.files.write(`${dir}/50m`, bigBuf), { n: 5, warmup: 1 })
  table.throughput('files.write 50 MiB', up.map((ms) => 50 * 1.048576 / (ms / 1000)), '≥ 300 MB/s')
  const down = await measure(() => sbx.files.read(`${dir}/50m`, { format: 'bytes' }), { n: 5, warmup: 1 })
  table.throughput('files.read 50 MiB', down.map((ms) => 50 * 1.048576 / (ms / 1000)))

  await sbx.files.remove(dir)
  table.print()
} finally {
  await envd.stop()
}

// firstByte measures, per run, the time from calling commands.run until the
// first onStdout callback.
async function firstByte(sbx) {
  const out = []
  const deadline = Date.now() + 30_000
  for (let i = 0; i < 100 && Date.now() < deadline; i++) {
    const t0 = process.hrtime.bigint()
    let first = 0n
    await sbx.commands.run('echo x', { onStdout: () => { if (!first) first = process.hrtime.bigint() } })
    out.push(Number(first - t0) / 1e6)
  }
  return out.sort((a, b) => a - b)
}
