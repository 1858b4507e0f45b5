// Starts test/e2e/egresshost: stand-in internet hosts in network
// namespaces of their own (198.18.0.0/15), for the egress tests and
// benchmarks. It needs root, like the platform project.
import { execFileSync, spawn } from 'node:child_process'
import { mkdtempSync } from 'node:fs'
import { fileURLToPath } from 'node:url'
import os from 'node:os'
import path from 'node:path'

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..')

// startEgressHosts builds and runs the helper; stop() removes the hosts.
export async function startEgressHosts({ prefix = 'e14' } = {}) {
  const bin = path.join(mkdtempSync(path.join(os.tmpdir(), 'egresshost-bin-')), 'egresshost')
  execFileSync('go', ['build', '-o', bin, './test/e2e/egresshost'], { cwd: repo, stdio: 'inherit' })
  const proc = spawn(bin, ['-prefix', prefix], { stdio: ['pipe', 'pipe', 'pipe'] })
  let err = ''
  proc.stderr.on('data', (d) => { err += d })
  const info = await new Promise((resolve, reject) => {
    let out = ''
    const timer = setTimeout(() => reject(new Error(`egresshost did not start in 120 s: ${err}`)), 120_000)
    proc.stdout.on('data', (d) => {
      out += d
      const nl = out.indexOf('\n')
      if (nl >= 0) {
        clearTimeout(timer)
        try { resolve(JSON.parse(out.slice(0, nl))) } catch (e) { reject(e) }
      }
    })
    proc.on('exit', (code) => { clearTimeout(timer); reject(new Error(`egresshost exited (${code}): ${err}`)) })
  })
  const reap = () => proc.kill('SIGKILL')
  process.once('exit', reap)
  return {
    ...info,
    async stop() {
      process.off('exit', reap)
      const gone = new Promise((r) => proc.once('exit', r))
      proc.stdin.end()
      const timer = setTimeout(() => proc.kill('SIGKILL'), 15_000)
      await gone
      clearTimeout(timer)
    },
  }
}
