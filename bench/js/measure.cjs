// Node and Bun measurements for bench/ (run by both runtimes):
//   measure.cjs cycle|shared|refused|anchors TARGET ITERS
//   measure.cjs waiter sidelease|sidelease-async|proper-lockfile TARGET
//   measure.cjs many-waits DIR N   (N acquireAsync waits and a 1 ms ticker)
'use strict';
const fs = require('node:fs');
const path = require('node:path');
const sidelease = require(path.join(__dirname, '..', '..', 'bindings-node', 'index.js'));

const isBun = Boolean(process.versions.bun);
let monotonicNs = () => process.hrtime.bigint(); // CLOCK_MONOTONIC in Node
if (isBun) {
  // Bun's hrtime counts from process start; read CLOCK_MONOTONIC itself.
  const { dlopen, ptr } = require('bun:ffi');
  const libc = dlopen('libc.so.6', { clock_gettime: { args: ['i32', 'ptr'], returns: 'i32' } });
  const ts = new BigInt64Array(2);
  monotonicNs = () => {
    libc.symbols.clock_gettime(1, ptr(ts));
    return ts[0] * 1000000000n + ts[1];
  };
}

function stats(ns) {
  ns.sort((a, b) => a - b);
  return { n: ns.length, median_ns: ns[ns.length >> 1], p99_ns: ns[Math.floor((ns.length - 1) * 0.99)] };
}

function measure(iters, f) {
  for (let i = 0; i < iters / 10 + 1; i++) f();
  const ns = new Array(iters);
  for (let i = 0; i < iters; i++) {
    const t = process.hrtime.bigint();
    f();
    ns[i] = Number(process.hrtime.bigint() - t);
  }
  return stats(ns);
}

async function measureAsync(iters, f) {
  for (let i = 0; i < iters / 10 + 1; i++) await f();
  const ns = new Array(iters);
  for (let i = 0; i < iters; i++) {
    const t = process.hrtime.bigint();
    await f();
    ns[i] = Number(process.hrtime.bigint() - t);
  }
  return stats(ns);
}

async function main() {
  const [mode, a, b] = process.argv.slice(2);
  if (mode === 'waiter') return waiter(a, b);
  if (mode === 'many-waits') return manyWaits(a, Number(b));
  const target = a;
  const iters = Number(b);
  let out;
  if (mode === 'cycle') out = measure(iters, () => sidelease.acquire(target).release());
  else if (mode === 'shared') {
    const held = sidelease.acquire(target);
    out = measure(iters, () => sidelease.acquire(target).release());
    held.release();
  } else if (mode === 'refused') {
    out = measure(iters, () => {
      try { sidelease.acquire(target); } catch (e) { if (e.code === 'SIDELEASE_IN_USE') return; throw e; }
      throw new Error('the lease should be held elsewhere');
    });
  } else if (mode === 'anchor:proper_lockfile_sync') {
    const lockfile = require('proper-lockfile');
    const file = target + '.proper';
    fs.writeFileSync(file, '');
    out = measure(iters, () => {
      lockfile.lockSync(file);
      lockfile.unlockSync(file);
    });
  } else if (mode === 'anchors') {
    const lockfile = require('proper-lockfile');
    const file = target + '.proper';
    fs.writeFileSync(file, '');
    out = {
      proper_lockfile_sync: measure(Math.min(iters, 2000), () => {
        lockfile.lockSync(file);
        lockfile.unlockSync(file);
      }),
      proper_lockfile_async: await measureAsync(Math.min(iters, 2000), async () => {
        const release = await lockfile.lock(file);
        await release();
      }),
    };
  } else throw new Error(`unknown mode ${mode}`);
  process.stdout.write(JSON.stringify(out) + '\n');
}

async function waiter(kind, target) {
  const readline = require('node:readline');
  const rl = readline.createInterface({ input: process.stdin });
  let release = null;
  for await (const line of rl) {
    if (line.startsWith('wait')) {
      if (kind === 'sidelease') {
        const l = sidelease.acquire(target, { timeout: 30000 });
        release = () => l.release();
      } else if (kind === 'sidelease-async') {
        const l = await sidelease.acquireAsync(target, { timeout: 30000 });
        release = () => l.release();
      } else {
        const lockfile = require('proper-lockfile');
        // Its retry option at the library's own backoff defaults.
        const r = await lockfile.lock(target, { retries: { retries: 100 } });
        release = r;
      }
      process.stdout.write(`${monotonicNs()}\n`);
    } else if (line.startsWith('release')) {
      await release();
      process.stdout.write('ok\n');
    } else break;
  }
  rl.close();
}

// Every waiter's acquisition time, and the ticks of a 1 ms timer whose gaps
// show how long the event loop was stalled (bench.py compares them with the
// holder's release times).
async function manyWaits(dir, n) {
  const acquired = new Array(n).fill(0);
  const held = [];
  const waits = [];
  for (let i = 0; i < n; i++) {
    waits.push(sidelease.acquireAsync(`${dir}/t${i}.db`, { timeout: 60000 }).then((l) => {
      acquired[i] = Number(monotonicNs());
      held.push(l);
    }));
  }
  await new Promise((r) => setTimeout(r, 500)); // every wait reaches the kernel
  const ticks = [];
  const ticker = setInterval(() => ticks.push(Number(monotonicNs())), 1);
  process.stdout.write('ready\n');
  await Promise.all(waits);
  clearInterval(ticker);
  for (const l of held) l.release();
  process.stdout.write(JSON.stringify({ acquired_ns: acquired, ticks_ns: ticks }) + '\n');
}

main().catch((e) => { console.error(e); process.exit(1); });
