import { defineConfig } from 'vitest/config'

// One real envd serves every test file, so files run one after another.
export default defineConfig({
  test: {
    globalSetup: ['./setup/envd.mjs'],
    fileParallelism: false,
    testTimeout: 60_000,
    hookTimeout: 30_000,
    include: ['tests/**/*.test.mjs'],
    env: { E2B_DEBUG: 'true' },
  },
})
