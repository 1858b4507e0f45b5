// The base template has what E2B's base has and E2B's tests use: python
// (not only python3), node, npm, git, curl, sudo; commands run as `user`
// in /home/user.
import { expect, test } from 'vitest'
import { Sandbox } from 'e2b'

test('python and python3, and the other tools of E2B\'s base', async () => {
  const sbx = await Sandbox.create()
  try {
    const r = await sbx.commands.run([
      `python -c 'import sys; print("python", sys.version_info[0])'`,
      `python3 -c 'import sys; print("python3", sys.version_info[0])'`,
      'node -e \'console.log("node")\'',
      'npm --version >/dev/null && echo npm',
      'git --version >/dev/null && echo git',
      'curl --version >/dev/null && echo curl',
      'sudo -n true && echo sudo',
      'echo $(whoami) $(pwd)',
    ].join(' && '))
    expect(r.stdout).toBe('python 3\npython3 3\nnode\nnpm\ngit\ncurl\nsudo\nuser /home/user\n')
  } finally {
    await sbx.kill()
  }
})
