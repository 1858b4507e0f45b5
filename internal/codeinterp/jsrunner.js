// Warren's JavaScript context: one long-lived Node process per context,
// driven by bridge.py. Each stdin line is a JSON request
// {path, marker, out, env, sandbox_env}: the cell's code is run in one
// persistent vm context (its globals and top-level declarations carry
// over), its value (awaited when it is a promise) or its exception is
// written as JSON to `out`, and the marker ends the cell's stdout and
// stderr. SIGINT interrupts a synchronous cell. Written for Warren.
'use strict'
const fs = require('fs')
const readline = require('readline')
const util = require('util')
const vm = require('vm')

const sandbox = {
  console, process, Buffer, URL, URLSearchParams, TextEncoder, TextDecoder,
  setTimeout, clearTimeout, setInterval, clearInterval, setImmediate, clearImmediate, queueMicrotask,
  require, module: { exports: {} }, exports: {}, __dirname: process.cwd(), __filename: 'cell.js',
  fetch: globalThis.fetch, structuredClone,
}
sandbox.global = sandbox
sandbox.globalThis = sandbox
const context = vm.createContext(sandbox)

process.on('SIGINT', () => {}) // an interrupt is for the cell, not this process

function report(out, res) {
  fs.writeFileSync(out, JSON.stringify(res))
}

async function run(req) {
  const res = {}
  const saved = {}
  for (const [k, v] of Object.entries(req.env || {})) {
    saved[k] = process.env[k]
    process.env[k] = v
  }
  try {
    let value = vm.runInContext(fs.readFileSync(req.path, 'utf8'), context, { filename: 'cell.js', breakOnSigint: true })
    if (value && typeof value.then === 'function') value = await value
    if (value !== undefined) res.text = util.inspect(value, { depth: 4 })
  } catch (e) {
    // A cell's errors come from the vm context's realm: not instanceof
    // this realm's Error.
    const err = e !== null && typeof e === 'object' && 'message' in e ? e : { name: 'Error', message: util.inspect(e), stack: '' }
    res.error = { name: err.name || 'Error', value: err.message || '', traceback: err.stack || '' }
  } finally {
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k]
      else process.env[k] = v
    }
  }
  report(req.out, res)
  process.stdout.write('\n' + req.marker + ' 0\n')
  process.stderr.write('\n' + req.marker + '\n')
}

const queue = []
let busy = false
async function next() {
  if (busy || queue.length === 0) return
  busy = true
  const req = queue.shift()
  try {
    for (const [k, v] of Object.entries(req.sandbox_env || {})) process.env[k] = v
    await run(req)
  } finally {
    busy = false
    next()
  }
}
readline.createInterface({ input: process.stdin }).on('line', (line) => {
  queue.push(JSON.parse(line))
  next()
}).on('close', () => process.exit(0))
