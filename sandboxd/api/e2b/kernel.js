// A JavaScript code context of an E2B sandbox: one node process per context, started by the code
// interpreter's in-sandbox driver (kernels.py) with `node -e`, fed one cell per line of stdin as JSON
// ({code, envs, marker}); what a cell prints goes to this process's stdout and stderr as it runs; its
// answer ({text} or {error}) goes to the file descriptor named in argv[1], after the marker has been
// written to stdout and stderr. Cells share one global scope, as in a notebook: node's REPL evaluator
// (top-level await, declarations that persist), with ES module imports turned into dynamic ones. The kernel's
// own names live in a function's scope: a cell's `const fs` or `function run` is the cell's, not the kernel's.
'use strict'
;(() => {
  const fs = require('fs')
  const repl = require('repl')
  const util = require('util')
  const { PassThrough } = require('stream')

  const answerFd = Number(process.argv[1])
  const typescript = process.argv[2] === 'ts' ? require('typescript') : null

  function javascript (code) {
    // TypeScript: its types stripped (not checked), as a notebook's TypeScript kernel runs a cell
    if (!typescript) return code
    const out = typescript.transpileModule(code, {
      compilerOptions: { target: typescript.ScriptTarget.ES2022, module: typescript.ModuleKind.ESNext }
    }).outputText
    return out.replace(/^export \{\};\s*$/m, '')
  }
  const server = repl.start({ input: new PassThrough(), output: new PassThrough(), terminal: false, useGlobal: true, prompt: '' })
  // The REPL's evaluator hands a cell's exception to its domain, never to the cell's callback: take it there.
  let failed = null
  server._domain.removeAllListeners('error')
  server._domain.on('error', (err) => { if (failed) failed(err) })

  function dynamicImports (code) {
    // import x from 'm' / import * as x from 'm' / import { a, b as c } from 'm' / import 'm'
    return code
      .replace(/^\s*import\s+\*\s+as\s+([\w$]+)\s+from\s+(['"][^'"]+['"])\s*;?/gm, 'const $1 = await import($2);')
      .replace(/^\s*import\s+([\w$]+)\s*,?\s*\{([^}]*)\}\s*from\s+(['"][^'"]+['"])\s*;?/gm,
        (_, d, names, m) => `const { default: ${d}, ${names.replace(/\s+as\s+/g, ': ')} } = await import(${m});`)
      .replace(/^\s*import\s+\{([^}]*)\}\s*from\s+(['"][^'"]+['"])\s*;?/gm,
        (_, names, m) => `const { ${names.replace(/\s+as\s+/g, ': ')} } = await import(${m});`)
      .replace(/^\s*import\s+([\w$]+)\s+from\s+(['"][^'"]+['"])\s*;?/gm, 'const $1 = (await import($2)).default;')
      .replace(/^\s*import\s+(['"][^'"]+['"])\s*;?/gm, 'await import($1);')
  }

  function shown (value) {
    if (value === undefined) return null
    if (typeof value === 'string') return value
    return util.inspect(value, { depth: 4, colors: false })
  }

  function failure (err) {
    // The cell's frames only: the kernel's own (node:, [eval], the REPL's) are not the program's.
    const stack = String((err && err.stack) || err).split('\n').filter((l) => !/\(node:|\[eval\]|REPLServer|<anonymous>/.test(l))
    return { error: { name: (err && err.name) || 'Error', value: String((err && err.message) || err), traceback: stack.join('\n') } }
  }

  function answer (marker, doc) {
    // After everything the cell wrote has left (a pipe takes 64 KiB at once: node queues the rest), the marker
    // on stdout and stderr, then the answer, tagged with the cell's marker (a stale or forged line is skipped).
    return new Promise((resolve) => {
      process.stdout.write('\x1e' + marker + '\n', () => {
        process.stderr.write('\x1e' + marker + '\n', () => {
          fs.writeSync(answerFd, JSON.stringify({ ...doc, marker }) + '\n')
          resolve()
        })
      })
    })
  }

  let queue = Promise.resolve()
  require('readline').createInterface({ input: process.stdin }).on('line', (line) => {
    queue = queue.then(() => run(JSON.parse(line)))
  })

  function run ({ code, envs, marker }) {
    const saved = {}
    for (const [k, v] of Object.entries(envs || {})) {
      saved[k] = process.env[k]
      process.env[k] = v
    }
    const restore = () => {
      for (const [k, v] of Object.entries(saved)) {
        if (v === undefined) delete process.env[k]
        else process.env[k] = v
      }
    }
    return new Promise((resolve) => {
      const fail = (err) => {
        failed = null
        restore()
        answer(marker, failure(err)).then(resolve)
      }
      failed = fail
      let source
      try {
        source = dynamicImports(javascript(code))
      } catch (err) {
        fail(err)
        return
      }
      server.eval(source, server.context, 'cell', (err, value) => {
        failed = null
        restore()
        if (err) {
          // an incomplete cell (the REPL would wait for more lines): a notebook's kernel calls it a SyntaxError
          const incomplete = err && err.constructor && err.constructor.name === 'Recoverable'
          answer(marker, incomplete ? failure(err.err || new SyntaxError('Unexpected end of input')) : failure(err))
            .then(resolve)
          return
        }
        Promise.resolve(value).then(
          (v) => answer(marker, { text: shown(v) }),
          (e) => answer(marker, failure(e))
        ).then(resolve)
      })
    })
  }
})()
