import { spawn } from 'node:child_process'
import { existsSync } from 'node:fs'
import { fileURLToPath } from 'node:url'
import path from 'node:path'

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..')
export const envdBinary = path.join(repo, 'bin', 'envd')

// startEnvd runs a real envd with the default user `user` and waits until
// GET /health answers 204. The default port is 49983 on both loopback
// families, where the SDK in debug mode connects (Node may resolve
// "localhost" to either). A token puts envd in access-token mode; without
// one it runs with --insecure-no-token (the SDK's debug mode sends none),
// which only a development envd on loopback may do, unless insecure is
// false: then it refuses everything but /health, as a real one does.
export async function startEnvd({ port = 49983, token, user = 'user', insecure = true, timeoutMs = 10_000 } = {}) {
  if (!existsSync(envdBinary)) {
    throw new Error(`${envdBinary} is missing: run \`make build\` first`)
  }
  const base = `http://127.0.0.1:${port}`
  // A leftover envd (e.g. from `make run`) would answer our health check
  // while ours fails to bind, and the tests would silently run against it.
  if (await healthy(base)) {
    throw new Error(`something already answers ${base}/health; stop it first (is \`make run\` still running?)`)
  }
  const addrs = port === 49983 ? `127.0.0.1:${port},[::1]:${port}` : `127.0.0.1:${port}`
  const env = { ...process.env }
  delete env.WARREN_ENVD_ACCESS_TOKEN
  if (token) env.WARREN_ENVD_ACCESS_TOKEN = token
  const args = ['--addr', addrs, '--user', user]
  if (!token && insecure) args.push('--insecure-no-token')
  const proc = spawn(envdBinary, args, {
    env,
    // envd logs every process it runs: only show that when asked to.
    stdio: ['ignore', 'inherit', process.env.WARREN_E2E_VERBOSE ? 'inherit' : 'ignore'],
  })
  let exited = null
  proc.on('exit', (code, signal) => { exited = { code, signal } })
  // If the runner dies without teardown, don't leave envd holding the port.
  const reap = () => proc.kill('SIGKILL')
  process.once('exit', reap)

  const deadline = Date.now() + timeoutMs
  while (!(await healthy(base))) {
    if (exited) throw new Error(`envd exited during start: ${JSON.stringify(exited)}`)
    if (Date.now() > deadline) {
      proc.kill('SIGKILL')
      throw new Error(`envd did not answer ${base}/health with 204 within ${timeoutMs} ms`)
    }
    await new Promise((r) => setTimeout(r, 20))
  }
  return {
    url: base,
    async stop() {
      process.off('exit', reap)
      if (exited) return
      const gone = new Promise((r) => proc.once('exit', r))
      proc.kill('SIGTERM')
      const timer = setTimeout(() => proc.kill('SIGKILL'), 3000)
      await gone
      clearTimeout(timer)
    },
  }
}

async function healthy(base) {
  try {
    const res = await fetch(`${base}/health`, { signal: AbortSignal.timeout(1000) })
    return res.status === 204
  } catch {
    return false
  }
}
