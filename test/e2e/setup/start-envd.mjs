import { spawn } from 'node:child_process'
import { existsSync } from 'node:fs'
import { fileURLToPath } from 'node:url'
import path from 'node:path'

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..')
export const envdBinary = path.join(repo, 'bin', 'envd')

// The SDK in debug mode connects to envd on this port.
const debugPort = 49983

// startEnvd runs a real envd with the default user `user` and waits until
// GET /health answers 204. Without a port it listens on 49983 on both
// loopback families, where the SDK in debug mode connects (Node may resolve
// "localhost" to either); `port: 'any'` picks a free port below the
// kernel's ephemeral range. A token puts envd in access-token mode; without
// one it runs with --insecure-no-token (the SDK's debug mode sends none),
// which only a development envd on loopback may do, unless insecure is
// false: then it refuses everything but /health, as a real one does.
//
// 49983 lies inside Linux's ephemeral range (32768–60999), so a client
// connection of a test running alongside may hold it as its local port for
// a moment and envd's bind fails: that is retried for a few seconds. A
// picked port that turns out busy is replaced by another.
export async function startEnvd({ port = debugPort, token, user = 'user', insecure = true, timeoutMs = 10_000 } = {}) {
  if (!existsSync(envdBinary)) {
    throw new Error(`${envdBinary} is missing: run \`make build\` first`)
  }
  const deadline = Date.now() + timeoutMs
  for (let attempt = 1; ; attempt++) {
    const p = port === 'any' ? 20000 + Math.floor(Math.random() * 12000) : port
    const started = await startOnce({ port: p, token, user, insecure, deadline, attempt })
    if (started.envd) return started.envd
    if (!started.busy || Date.now() > deadline) {
      throw new Error(`envd on port ${p} exited during start (attempt ${attempt}): ${JSON.stringify(started.exited)}: ${started.stderr.trim()}`)
    }
    await new Promise((r) => setTimeout(r, 100))
  }
}

async function startOnce({ port, token, user, insecure, deadline, attempt }) {
  const base = `http://127.0.0.1:${port}`
  // A leftover envd (e.g. from `make run`) would answer our health check
  // while ours fails to bind, and the tests would silently run against it.
  if (await healthy(base)) {
    throw new Error(`something already answers ${base}/health; stop it first (is \`make run\` still running?)`)
  }
  const addrs = port === debugPort ? `127.0.0.1:${port},[::1]:${port}` : `127.0.0.1:${port}`
  const env = { ...process.env }
  delete env.WARREN_ENVD_ACCESS_TOKEN
  if (token) env.WARREN_ENVD_ACCESS_TOKEN = token
  const args = ['--addr', addrs, '--user', user]
  if (!token && insecure) args.push('--insecure-no-token')
  const proc = spawn(envdBinary, args, { env, stdio: ['ignore', 'inherit', 'pipe'] })
  // envd logs every process it runs: only show that when asked to. The
  // start's own lines are kept to explain a failed start.
  let stderr = ''
  proc.stderr.on('data', (chunk) => {
    if (process.env.WARREN_E2E_VERBOSE) process.stderr.write(chunk)
    if (stderr.length < 64 * 1024) stderr += chunk
  })
  let exited = null
  const exit = new Promise((r) => proc.once('exit', (code, signal) => { exited = { code, signal }; r() }))
  // If the runner dies without teardown, don't leave envd holding the port.
  const reap = () => proc.kill('SIGKILL')
  process.once('exit', reap)

  while (!(await healthy(base))) {
    if (exited) {
      if (!proc.stderr.closed) await new Promise((r) => proc.stderr.once('close', r))
      process.off('exit', reap)
      return { exited, stderr, busy: stderr.includes('address already in use') }
    }
    if (Date.now() > deadline) {
      proc.kill('SIGKILL')
      process.off('exit', reap)
      throw new Error(`envd did not answer ${base}/health with 204 in time${attempt > 1 ? ` (attempt ${attempt}; the earlier ones found the port busy)` : ''}: ${stderr.trim()}`)
    }
    await new Promise((r) => setTimeout(r, 20))
  }
  // After the start only a verbose run shows what envd logs.
  stderr = null
  proc.stderr.removeAllListeners('data')
  proc.stderr.resume()
  if (process.env.WARREN_E2E_VERBOSE) proc.stderr.pipe(process.stderr)
  return {
    envd: {
      url: base,
      async stop() {
        process.off('exit', reap)
        if (exited) return
        proc.kill('SIGTERM')
        const timer = setTimeout(() => proc.kill('SIGKILL'), 3000)
        await exit
        clearTimeout(timer)
      },
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
