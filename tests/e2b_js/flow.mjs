// E2B's JavaScript SDK (npm `e2b`, `@e2b/code-interpreter`, the versions package.json pins) against a node's
// E2B API, as a TypeScript agent backend drives it: only E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL point at
// the node. Run by tests/test_e2b_versions.py; prints one line per check and exits non-zero on the first failure.
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import { Sandbox } from '@e2b/code-interpreter'
import { Sandbox as BaseSandbox, NotFoundError, AuthenticationError, SandboxError } from 'e2b'

const require = createRequire(import.meta.url)
const versions = `${require('e2b/package.json').version}/${require('@e2b/code-interpreter/package.json').version}`
console.log(`e2b/@e2b/code-interpreter ${versions}`)

const check = async (name, fn) => {
  await fn()
  console.log(`ok ${name}`)
}

const sbx = await Sandbox.create({ metadata: { flow: 'js' }, envs: { GREETING: 'hello' }, timeoutMs: 120_000 })
await check('run code with state', async () => {
  assert.equal((await sbx.runCode('x = 41')).error, undefined)
  assert.equal((await sbx.runCode('x + 1')).text, '42')
  assert.equal((await sbx.runCode("import os; os.environ['GREETING']")).text, 'hello')
  const failed = await sbx.runCode('1 / 0')
  assert.equal(failed.error.name, 'ZeroDivisionError')
})
await check('connect, info, list, timeout', async () => {
  const again = await Sandbox.connect(sbx.sandboxId)
  assert.equal((await again.runCode('x')).text, '41')
  const info = await sbx.getInfo()
  assert.deepEqual(info.metadata, { flow: 'js' })
  const listed = await BaseSandbox.list({ query: { metadata: { flow: 'js' } } }).nextItems()
  assert.deepEqual(listed.map((s) => s.sandboxId), [sbx.sandboxId])
  await sbx.setTimeout(60_000)
  assert.equal(await sbx.isRunning(), true)
})
await check('commands and files', async () => {
  await sbx.files.write('/home/user/solve.py', 'print(6 * 7)')
  const ran = await sbx.commands.run('python solve.py')
  assert.equal(ran.exitCode, 0)
  assert.equal(ran.stdout, '42\n')
  assert.equal(await sbx.files.read('/home/user/solve.py'), 'print(6 * 7)')
  assert.ok((await sbx.files.list('/home/user')).some((e) => e.name === 'solve.py'))
})
await check('what is not served is an SDK error', async () => {
  await assert.rejects(sbx.pause(), (e) => e instanceof SandboxError && /not served/.test(e.message))
  await assert.rejects(Sandbox.create('my-own-image'), (e) => e instanceof SandboxError && /not served/.test(e.message))
  await assert.rejects(sbx.getMetrics(), (e) => e instanceof SandboxError && /not served/.test(e.message))
})
await check('a wrong key', async () => {
  await assert.rejects(Sandbox.create({ apiKey: 'e2b_' + '0'.repeat(40) }), AuthenticationError)
})
await check('kill, then gone', async () => {
  await sbx.kill()
  assert.equal(await BaseSandbox.kill(sbx.sandboxId), false)
  await assert.rejects(Sandbox.connect(sbx.sandboxId), NotFoundError)
})
console.log('all passed')
