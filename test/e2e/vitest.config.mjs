import { defineConfig } from 'vitest/config'

// Two projects. "envd": the SDK in debug mode against one real envd on
// localhost:49983 (the daemon alone). "platform": the SDK as a user runs
// it, against a real `warren serve` that starts real sandboxes. Files
// run one after another: each project shares one server.
export default defineConfig({
  test: {
    fileParallelism: false,
    testTimeout: 60_000,
    hookTimeout: 60_000,
    projects: [
      {
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
