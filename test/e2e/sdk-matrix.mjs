// The SDK matrix of the e2e suite. `e2b` in package.json is the pinned SDK;
// each `e2b-sdk-*` alias (npm:e2b@X) is another version. Likewise
// `@e2b/code-interpreter` and its `e2b-ci-sdk-*` aliases
// (npm:@e2b/code-interpreter@X). This prints the packages of the distinct
// versions installed, one per line, or, with --run, runs the suite once
// per distinct e2b version (E2B_SDK_PACKAGE picks the package vitest
// resolves `e2b` to; see vitest.config.mjs), then the code-interpreter
// files once per distinct code-interpreter version other than the pinned
// one (E2B_CI_SDK_PACKAGE), passing any further arguments to vitest.
import { readFileSync } from 'node:fs'
import { spawnSync } from 'node:child_process'
import { createRequire } from 'node:module'

const require = createRequire(import.meta.url)
const pkg = JSON.parse(readFileSync(new URL('./package.json', import.meta.url)))
// distinct maps each version of the packages pinned and aliased to the
// first package name that has it, the pinned one first.
function distinct(pinned, aliasPrefix) {
  const names = Object.keys(pkg.devDependencies).filter((n) => n === pinned || n.startsWith(aliasPrefix))
  names.sort((a, b) => (a === pinned ? -1 : b === pinned ? 1 : 0))
  const byVersion = new Map()
  for (const name of names) {
    const { version } = require(`${name}/package.json`)
    if (!byVersion.has(version)) byVersion.set(version, name)
  }
  return byVersion
}
const byVersion = distinct('e2b', 'e2b-sdk-')
const ciByVersion = distinct('@e2b/code-interpreter', 'e2b-ci-sdk-')

// The files that import @e2b/code-interpreter.
const ciFiles = ['platform/code-interpreter']

const args = process.argv.slice(2)
if (args[0] !== '--run') {
  for (const [version, name] of byVersion) console.log(`${name} ${version}`)
  for (const [version, name] of ciByVersion) console.log(`${name} ${version}`)
  process.exit(0)
}
function vitest(env, extra) {
  const r = spawnSync('npx', ['vitest', 'run', ...extra], { stdio: 'inherit', env: { ...process.env, ...env } })
  if (r.status !== 0) process.exit(r.status ?? 1)
}
for (const [version, name] of byVersion) {
  console.log(`\n== the e2e suite with e2b ${version} (${name})\n`)
  vitest({ E2B_SDK_PACKAGE: name }, args.slice(1))
}
for (const [version, name] of ciByVersion) {
  if (name === '@e2b/code-interpreter') continue // the runs above had it
  console.log(`\n== the code-interpreter files with @e2b/code-interpreter ${version} (${name})\n`)
  vitest({ E2B_CI_SDK_PACKAGE: name }, [...ciFiles, ...args.slice(1)])
}
