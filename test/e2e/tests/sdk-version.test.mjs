// The suite runs against the SDK version the matrix picked
// (E2B_SDK_PACKAGE, sdk-matrix.mjs): the 'e2b' every test imports is that
// package, not the default one.
import { expect, test } from 'vitest'
import { createRequire } from 'node:module'
import * as e2b from 'e2b'

test('the SDK under test is the one the matrix picked', async () => {
  const pkg = process.env.E2B_SDK_PACKAGE || 'e2b'
  const picked = await import(/* @vite-ignore */ pkg)
  // The same module instance: two copies of the SDK are never the same.
  expect(e2b.Sandbox).toBe(picked.Sandbox)
  const { version } = createRequire(import.meta.url)(`${pkg}/package.json`)
  console.log(`e2b SDK under test: ${version} (${pkg})`)
})
