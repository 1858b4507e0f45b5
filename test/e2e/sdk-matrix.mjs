// The SDK matrix of the e2e suite. `e2b` in package.json is the pinned SDK;
// each `e2b-sdk-*` alias (npm:e2b@X) is another version. This prints the
// packages of the distinct versions installed, one per line, or, with
// --run, runs the suite once per distinct version (E2B_SDK_PACKAGE picks
// the package vitest resolves `e2b` to; see vitest.config.mjs), passing
// any further arguments to vitest.
import { readFileSync } from 'node:fs'
import { spawnSync } from 'node:child_process'
import { createRequire } from 'node:module'

const require = createRequire(import.meta.url)
const pkg = JSON.parse(readFileSync(new URL('./package.json', import.meta.url)))
const names = Object.keys(pkg.devDependencies).filter((n) => n === 'e2b' || n.startsWith('e2b-sdk-'))
const byVersion = new Map()
for (const name of names) {
  const { version } = require(`${name}/package.json`)
  if (!byVersion.has(version)) byVersion.set(version, name)
}

const args = process.argv.slice(2)
if (args[0] !== '--run') {
  for (const [version, name] of byVersion) console.log(`${name} ${version}`)
  process.exit(0)
}
for (const [version, name] of byVersion) {
  console.log(`\n== the e2e suite with e2b ${version} (${name})\n`)
  const r = spawnSync('npx', ['vitest', 'run', ...args.slice(1)], { stdio: 'inherit', env: { ...process.env, E2B_SDK_PACKAGE: name } })
  if (r.status !== 0) process.exit(r.status ?? 1)
}
