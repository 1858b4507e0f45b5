import { createRequire } from 'node:module'
import { defineConfig } from 'vitest/config'

// The SDK under test: `e2b`, or another version of the matrix
// (E2B_SDK_PACKAGE=e2b-sdk-…, see sdk-matrix.mjs), which every test's
// import of 'e2b' then resolves to.
const sdk = process.env.E2B_SDK_PACKAGE || 'e2b'
if (sdk !== 'e2b' && !sdk.startsWith('e2b-sdk-')) throw new Error(`E2B_SDK_PACKAGE=${sdk}: want e2b or an e2b-sdk-* alias`)
const sdkVersion = createRequire(import.meta.url)(`${sdk}/package.json`).version
console.log(`e2b SDK under test: ${sdkVersion} (${sdk})`)
const alias = sdk === 'e2b' ? [] : [{ find: /^e2b$/, replacement: sdk }]

// The code-interpreter SDK under test: `@e2b/code-interpreter`, or another
// version of the matrix (E2B_CI_SDK_PACKAGE=e2b-ci-sdk-…).
const ciSdk = process.env.E2B_CI_SDK_PACKAGE || '@e2b/code-interpreter'
if (ciSdk !== '@e2b/code-interpreter' && !ciSdk.startsWith('e2b-ci-sdk-')) throw new Error(`E2B_CI_SDK_PACKAGE=${ciSdk}: want @e2b/code-interpreter or an e2b-ci-sdk-* alias`)
const ciSdkVersion = createRequire(import.meta.url)(`${ciSdk}/package.json`).version
console.log(`@e2b/code-interpreter under test: ${ciSdkVersion} (${ciSdk})`)
if (ciSdk !== '@e2b/code-interpreter') alias.push({ find: /^@e2b\/code-interpreter$/, replacement: ciSdk })

// Two projects. "envd": the SDK in debug mode against one real envd on
// localhost:49983 (the daemon alone). "platform": the SDK as a user runs
// it, against a real `warren serve` that starts real sandboxes. Files
// run one after another: each project shares one server.
export default defineConfig({
  resolve: { alias },
  test: {
    fileParallelism: false,
    testTimeout: 60_000,
    hookTimeout: 60_000,
    projects: [
      {
        resolve: { alias },
        test: {
          name: 'envd',
          globalSetup: ['./setup/envd.mjs'],
          include: ['tests/**/*.test.mjs'],
          env: { E2B_DEBUG: 'true' },
          fileParallelism: false,
          testTimeout: 60_000,
          hookTimeout: 30_000,
        },
      },
      {
        resolve: { alias },
        test: {
          name: 'platform',
          globalSetup: ['./setup/warren.mjs'],
          setupFiles: ['./setup/platform-env.mjs'],
          include: ['platform/**/*.test.mjs'],
          fileParallelism: false,
          testTimeout: 60_000,
          hookTimeout: 60_000,
        },
      },
    ],
  },
})
