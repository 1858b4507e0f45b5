import { Sandbox } from 'e2b'
import { startWarren, killAll } from '/work/main/test/e2e/setup/start-warren.mjs'
const w = await startWarren({ instance: 'dbg', net16: 130, poolSize: Number(process.argv[2]) })
const conn = { apiUrl: w.apiUrl, sandboxUrl: w.sandboxUrl, apiKey: w.apiKey }
try {
  for (let i = 0; i < 6; i++) {
    const sbx = await Sandbox.create(conn)
    try {
      const r = await sbx.commands.run('for c in "bash -l -c true" "bash -c true" "/bin/true"; do s=$(date +%s%N); $c; e=$(date +%s%N); echo "$c $(( (e-s)/1000000 ))ms"; done')
      console.log(i, r.stdout.replace(/\n/g, ' | '))
    } catch (e) {
      console.log('ERR', i, sbx.sandboxId, e.message)
      const logs = await fetch(`${w.apiUrl}/sandboxes/${sbx.sandboxId}/logs`, { headers: { 'X-API-Key': w.apiKey } }).then(r => r.json())
      console.log(logs.logs.map(l => l.line).join('\n'))
    }
    await sbx.kill()
  }
} finally {
  await killAll(w); await w.stop({removeDataDir: true}); console.log(w.output().split('\n').filter(l => l.includes('level=')).join('\n'))
}
