// Copies the dashboard's third-party browser code, built and minified by
// its authors, from node_modules into ../web/vendor, with each package's
// license. Run after changing a version in package.json; the copies are
// committed, so that `make build` needs neither Node nor the network.
import { copyFileSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'

const here = dirname(fileURLToPath(import.meta.url))
const out = join(here, '..', 'web', 'vendor')
mkdirSync(out, { recursive: true })
const files = [
  ['@xterm/xterm/lib/xterm.mjs', 'xterm.mjs'],
  ['@xterm/xterm/css/xterm.css', 'xterm.css'],
  ['@xterm/xterm/LICENSE', 'LICENSE.xterm'],
  ['@xterm/addon-fit/lib/addon-fit.mjs', 'addon-fit.mjs'],
  ['@xterm/addon-fit/LICENSE', 'LICENSE.addon-fit'],
  ['uplot/dist/uPlot.iife.min.js', 'uPlot.iife.min.js'],
  ['uplot/dist/uPlot.min.css', 'uPlot.min.css'],
  ['uplot/LICENSE', 'LICENSE.uplot'],
]
const versions = {}
for (const [from, to] of files) {
  const src = join(here, 'node_modules', from)
  let body = readFileSync(src, 'utf8')
  body = body.replace(/\n\/\/# sourceMappingURL=\S+\s*$/, '\n') // maps are not shipped
  writeFileSync(join(out, to), body)
  const pkg = from.startsWith('@') ? from.split('/').slice(0, 2).join('/') : from.split('/')[0]
  versions[pkg] = JSON.parse(readFileSync(join(here, 'node_modules', pkg, 'package.json'), 'utf8')).version
}
writeFileSync(join(out, 'VERSIONS.json'), JSON.stringify(versions, null, 2) + '\n')
console.log(`vendored into ${out}:`, versions)
