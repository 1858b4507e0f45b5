import { spawn } from 'node:child_process'
import { existsSync } from 'node:fs'
import { fileURLToPath } from 'node:url'
import path from 'node:path'

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..')
export const envdBinary = path.join(repo, 'bin', 'envd')

// startEnvd runs envd on both loopback families (Node may resolve
// "localhost" to either) with the default user `user`, and waits until
// GET /health answers 204.
export async function startEnvd({ user = 'user', timeoutMs = 10_000 } = {}) {
  if (!existsSync(envdBinary)) {
    throw new Error(`${envdBinary} is missing: run \`make build\` first`)
  }
  const proc = spawn(envdBinary, ['--addr', '127.0.0.1:49983,[::1]:49983', '--user', user], {
    stdio: ['ignore', 'inherit', 'inherit'],
  })
  let exited = null
  proc.on('exit', (code, signal) => { exited = { code, signal } })
  const deadline = Date.now() + timeoutMs
  for (;;) {
    if (exited) throw new Error(`envd exited during start: ${JSON.stringify(exited)}`)
    try {
      const res = await fetch('http://127.0.0.1:49983/health')
      if (res.status === 204) break
    } catch {}
    if (Date.now() > deadline) {
      proc.kill('SIGKILL')
      throw new Error('envd did not become healthy in time')
    }
    await new Promise((r) => setTimeout(r, 20))
  }
  return {
    async stop() {
      if (exited) return
      const gone = new Promise((r) => proc.once('exit', r))
      proc.kill('SIGTERM')
      const timer = setTimeout(() => proc.kill('SIGKILL'), 3000)
      await gone
      clearTimeout(timer)
    },
  }
}
