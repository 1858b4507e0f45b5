// Warren's JavaScript and TypeScript contexts: one long-lived Node process
// per context, driven by bridge.py (argv: [typescript] [status fd]). Each stdin line is a JSON request
// {path, marker, out, env, sandbox_env}: the cell's code is run in one
// persistent vm context (its globals and top-level declarations carry
// over), its value (awaited when it is a promise) or its exception is
// written as JSON to `out`, and the marker ends the cell's stdout and
// stderr. SIGINT interrupts a synchronous cell. A TypeScript context
// first compiles each cell with Debian's TypeScript (transpileModule: types
// are stripped, not checked, as E2B's TypeScript kernel does; imports
// become require calls); a cell that does not parse fails with a
// SyntaxError naming the line and column. Written for Warren.
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

const typescript = process.argv[2] === 'typescript'
// Loaded once, before the first cell (~0.3 s), so that cells do not wait.
// Debian's node-typescript is in /usr/share/nodejs, where Debian's Node
// looks and other builds of Node may not.
const ts = typescript ? requireTypeScript() : null

function requireTypeScript() {
  try {
    return require('typescript')
  } catch {
    return require('/usr/share/nodejs/typescript')
  }
}

// compile returns the cell's JavaScript: itself, or its TypeScript
// compiled.
function compile(code) {
  if (!typescript) return code
  const out = ts.transpileModule(code, {
    fileName: 'cell.ts',
    reportDiagnostics: true,
    compilerOptions: { target: ts.ScriptTarget.ES2022, module: ts.ModuleKind.CommonJS, esModuleInterop: true },
  })
  const errors = (out.diagnostics || []).filter((d) => d.category === ts.DiagnosticCategory.Error)
  if (errors.length > 0) {
    const where = (d) => (d.file && d.start !== undefined ? d.file.getLineAndCharacterOfPosition(d.start) : null)
    const lines = errors.map((d) => {
      const w = where(d)
      const at = w ? `cell.ts:${w.line + 1}:${w.character + 1} - ` : ''
      return `${at}error TS${d.code}: ${ts.flattenDiagnosticMessageText(d.messageText, '\n')}`
    })
    const first = where(errors[0])
    const err = new SyntaxError(ts.flattenDiagnosticMessageText(errors[0].messageText, '\n') + (first ? ` (${first.line + 1}:${first.character + 1})` : ''))
    err.stack = `SyntaxError: ${err.message}\n${lines.join('\n')}`
    throw err
  }
  return out.outputText
}

process.on('SIGINT', () => {}) // an interrupt is for the cell, not this process

// The bridge's status pipe: "r <marker>" when a cell's code starts to run
// (its SIGINT may come now), "d <marker>" when it returned.
const statusFd = process.argv[3] === undefined ? -1 : Number(process.argv[3])
function status(word, marker) {
  if (statusFd >= 0) fs.writeSync(statusFd, word + ' ' + marker + '\n')
}

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
    const code = compile(fs.readFileSync(req.path, 'utf8'))
    let value
    status('r', req.marker)
    try {
      value = vm.runInContext(code, context, { filename: typescript ? 'cell.ts' : 'cell.js', breakOnSigint: true })
    } finally {
      status('d', req.marker)
    }
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
