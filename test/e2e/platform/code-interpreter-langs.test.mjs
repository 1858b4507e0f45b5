// @e2b/code-interpreter against code-interpreter-v1: TypeScript and R
// contexts, and the data-analysis libraries past numpy/pandas/matplotlib.
// The SDK is the one the matrix picked (sdk-matrix.mjs: the pinned
// @e2b/code-interpreter, or an e2b-ci-sdk-* alias).
import { afterAll, beforeAll, expect, test } from 'vitest'
import { Sandbox } from '@e2b/code-interpreter'

let sbx

beforeAll(async () => {
  sbx = await Sandbox.create({ timeoutMs: 300_000 })
}, 120_000)

afterAll(async () => {
  await sbx?.kill()
})

test('the code-interpreter SDK under test is the one the matrix picked', async () => {
  const pkg = process.env.E2B_CI_SDK_PACKAGE || '@e2b/code-interpreter'
  const picked = await import(/* @vite-ignore */ pkg)
  // The same module instance: two copies of the SDK are never the same.
  expect(Sandbox).toBe(picked.Sandbox)
})

test('TypeScript cells keep their state and give values', async () => {
  const first = await sbx.runCode('interface Point { x: number; y: number }\nconst p: Point = { x: 40, y: 2 }\nconsole.log("typed", p.x)\np.x + p.y', { language: 'ts' })
  expect(first.error).toBeUndefined()
  expect(first.text).toBe('42')
  expect(first.logs.stdout.join('')).toBe('typed 40\n')
  const second = await sbx.runCode('import { basename } from "path"\nconst label: string = basename("/data/file.csv");\n`${label}:${p.x * 2}`', { language: 'typescript' })
  expect(second.error).toBeUndefined()
  expect(second.text).toBe('file.csv:80')
  // The JavaScript context is another one.
  expect((await sbx.runCode('typeof p', { language: 'js' })).text).toBe('undefined')
})

test('TypeScript errors: a cell that does not parse, and an exception', async () => {
  const syntax = await sbx.runCode('const broken: = 1', { language: 'ts' })
  expect(syntax.error.name).toBe('SyntaxError')
  expect(syntax.error.value).toMatch(/Type expected/)
  expect(syntax.error.traceback).toMatch(/TS1110/)
  const thrown = await sbx.runCode('function check(n: number): number { if (n < 0) throw new RangeError(`negative: ${n}`); return n }\ncheck(-1)', { language: 'ts' })
  expect(thrown.error.name).toBe('RangeError')
  expect(thrown.error.value).toBe('negative: -1')
  expect(thrown.error.traceback).toContain('check')
  expect(thrown.text).toBeUndefined()
})

test('a TypeScript context of its own, with its cwd', async () => {
  const ctx = await sbx.createCodeContext({ language: 'ts', cwd: '/tmp' })
  expect(ctx.language).toBe('typescript')
  expect((await sbx.runCode('const where: string = process.cwd()\nwhere', { context: ctx })).text).toBe('/tmp')
  await sbx.removeCodeContext(ctx)
})

test('R cells keep their state and give values, as IRkernel does', async () => {
  const first = await sbx.runCode('x <- 41\nprint("from R")\nx + 1', { language: 'r' })
  expect(first.error).toBeUndefined()
  expect(first.logs.stdout.join('')).toBe('[1] "from R"\n')
  expect(first.results[0].text).toBe('[1] 42')
  const second = await sbx.runCode('x * 2', { language: 'r' })
  expect(second.results[0].text).toBe('[1] 82')
  const env = await sbx.runCode('Sys.getenv("FOO")', { language: 'r', envs: { FOO: 'bar' } })
  expect(env.results[0].text).toBe('[1] "bar"')
  const after = await sbx.runCode('Sys.getenv("FOO", unset = "default")', { language: 'r' })
  expect(after.results[0].text).toBe('[1] "default"')
})

test('an R error', async () => {
  const ex = await sbx.runCode('check <- function(n) if (n < 0) stop("negative input") else n\ncheck(-1)', { language: 'r' })
  expect(ex.error.name).toBe('ERROR')
  expect(ex.error.value).toContain('negative input')
  expect(ex.error.traceback).toContain('check(-1)')
})

test('an R data.frame and an R plot', async () => {
  const df = await sbx.runCode('data.frame(city = c("Oslo", "Lima"), temp = c(4.5, 19))', { language: 'r' })
  expect(df.error).toBeUndefined()
  expect(df.results[0].html).toContain('<table')
  expect(df.results[0].html).toContain('Lima')
  expect(df.results[0].text).toMatch(/city\s+temp/)
  const plot = await sbx.runCode('plot(1:10, main = "squares")', { language: 'r' })
  expect(plot.error).toBeUndefined()
  const png = plot.results.find((r) => r.png)
  expect(png).toBeDefined()
  expect(Buffer.from(png.png, 'base64').subarray(1, 4).toString()).toBe('PNG')
})

test('an R context of its own, with its cwd', async () => {
  const ctx = await sbx.createCodeContext({ language: 'r', cwd: '/tmp' })
  expect(ctx.language).toBe('r')
  expect((await sbx.runCode('getwd()', { context: ctx })).results[0].text).toBe('[1] "/tmp"')
  expect((await sbx.runCode('exists("x")', { context: ctx })).results[0].text).toBe('[1] FALSE')
  await sbx.removeCodeContext(ctx)
})

// The first import of a library reads and runs many modules: on a busy
// machine under gVisor, seconds.
const importTimeout = 120_000

test('scipy imports and works', async () => {
  const sci = await sbx.runCode('from scipy import stats, optimize\nr = optimize.minimize_scalar(lambda v: (v - 3) ** 2)\nround(r.x, 3), round(stats.norm.cdf(0), 2)')
  expect(sci.error).toBeUndefined()
  expect(sci.text).toBe('(3.0, 0.5)')
}, importTimeout)

test('scikit-learn imports and works', async () => {
  const sk = await sbx.runCode([
    'from sklearn.linear_model import LinearRegression',
    'import numpy as np',
    'X = np.arange(10).reshape(-1, 1); y = 3 * X.ravel() + 1',
    'm = LinearRegression().fit(X, y)',
    'round(float(m.coef_[0]), 3), round(float(m.intercept_), 3)',
  ].join('\n'))
  expect(sk.error).toBeUndefined()
  expect(sk.text).toBe('(3.0, 1.0)')
}, importTimeout)

test('a seaborn plot comes back as a PNG and a bar chart', async () => {
  const sns = await sbx.runCode([
    'import seaborn as sns, pandas as pd, matplotlib.pyplot as plt',
    'df = pd.DataFrame({"k": ["a", "b", "c"], "v": [1, 3, 2]})',
    'ax = sns.barplot(data=df, x="k", y="v")',
    'ax.set_title("by k")',
    'plt.show()',
  ].join('\n'))
  expect(sns.error).toBeUndefined()
  const fig = sns.results.find((r) => r.png)
  expect(fig).toBeDefined()
  expect(fig.chart?.type).toBe('bar')
  expect(fig.chart?.title).toBe('by k')
}, importTimeout)

test('the other data libraries import', async () => {
  const more = await sbx.runCode('import statsmodels.api, bs4, xlrd, xlsxwriter, networkx, sympy, yaml, tabulate, tqdm; "ok"')
  expect(more.error).toBeUndefined()
  expect(more.text).toBe('ok')
}, importTimeout)
