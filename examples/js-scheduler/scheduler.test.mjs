// The node-cron examples, run by real Node (node:cluster, 4 workers; PM2's
// cluster mode, 4 instances under pm2-runtime) and real Bun (4 Bun.serve
// processes with reusePort): the job ticks in one process at a time,
// across SIGKILLed leaders.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { createRequire } from 'node:module';

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.join(here, '..', '..');
const BUN = path.join(root, 'bindings-node', 'node_modules', '@oven', 'bun-linux-x64', 'bin', 'bun');
const MODULE = path.join(root, 'bindings-node', 'index.js');
const sidelease = createRequire(import.meta.url)(MODULE);
const PM2_RUNTIME = path.join(here, 'node_modules', 'pm2', 'bin', 'pm2-runtime');
const STEP = 15_000;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function freePort() {
  return new Promise((resolve) => {
    const s = net.createServer().listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

function files() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sidelease-sched-'));
  return { dir, db: path.join(dir, 'app.db'), ticks: path.join(dir, 'ticks.log') };
}

function ticks(file) {
  let text = '';
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch (e) {
    if (e.code !== 'ENOENT') throw e;
  }
  return text.split('\n').filter(Boolean).map((l) => Number(l.split(' ')[0]));
}

function runs(file) {
  const out = [];
  for (const p of ticks(file)) if (out[out.length - 1] !== p) out.push(p);
  return out;
}

/** Until the last `n` ticks came from one pid `ok` accepts: that pid. */
async function tickingFrom(file, ok, n = 2) {
  const deadline = Date.now() + STEP;
  while (Date.now() < deadline) {
    const last = ticks(file).slice(-n);
    if (last.length === n && last.every((p) => p === last[0]) && ok(last[0])) return last[0];
    await sleep(20);
  }
  throw new Error(`no ${n} ticks in a row from an accepted process: ${ticks(file).slice(-10)}`);
}

function childrenOf(pid) {
  try {
    return execFileSync('ps', ['-o', 'pid=', '--ppid', String(pid)], { encoding: 'utf8' }).split(/\s+/).filter(Boolean).map(Number);
  } catch {
    return [];
  }
}

async function get(port) {
  return (await fetch(`http://127.0.0.1:${port}/`)).json();
}

async function killAndFollow(file, leader, killed, pidsNow) {
  process.kill(leader, 'SIGKILL');
  killed.push(leader);
  const t = Date.now();
  const next = await tickingFrom(file, (p) => !killed.includes(p), 1);
  assert.ok(Date.now() - t < 3000, `the next tick came ${Date.now() - t} ms after the kill`);
  assert.ok(pidsNow().includes(next));
  return next;
}

test('node:cluster: the cron job runs in one worker at a time, across SIGKILLed leaders', { timeout: 60_000 }, async () => {
  const { dir, db, ticks: file } = files();
  const port = await freePort();
  const primary = spawn(process.execPath, [path.join(here, 'cluster.js')], {
    env: { ...process.env, APP_DB: db, APP_TICKS: file, PORT: String(port), SIDELEASE_MODULE: MODULE },
    stdio: ['ignore', 'inherit', 'inherit'],
  });
  try {
    const workers = () => childrenOf(primary.pid);
    let leader = await tickingFrom(file, (p) => workers().includes(p));
    const killed = [];
    for (let i = 0; i < 2; i++) leader = await killAndFollow(file, leader, killed, workers);
    const deadline = Date.now() + STEP;
    while (workers().length < 4 && Date.now() < deadline) await sleep(20);
    assert.equal(workers().length, 4, 'the killed workers were replaced');
    await sleep(1500);
    assert.deepEqual(runs(file), [...killed, leader], 'each leader ticked in one run, the replacements follow');
    const answers = await Promise.all(Array.from({ length: 16 }, () => get(port)));
    for (const a of answers) assert.equal(a.leading, a.pid === leader, JSON.stringify(a));
    const exited = new Promise((r) => primary.once('exit', r));
    primary.kill('SIGTERM');
    await exited;
    assert.equal(sidelease.inspect(db).state, 'free');
  } finally {
    if (primary.exitCode === null && primary.signalCode === null) {
      for (const w of childrenOf(primary.pid)) process.kill(w, 'SIGKILL');
      primary.kill('SIGKILL');
    }
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('PM2: 4 instances in cluster mode under pm2-runtime, the cron job in one at a time', { timeout: 60_000 }, async () => {
  const { dir, db, ticks: file } = files();
  // pm2-runtime runs PM2 in the foreground (as in a container): the
  // instances are its children, and PM2_HOME keeps its state in `dir`.
  const runtime = spawn(process.execPath, [PM2_RUNTIME, path.join(here, 'ecosystem.config.js')], {
    env: { ...process.env, APP_DB: db, APP_TICKS: file, SIDELEASE_MODULE: MODULE, PM2_HOME: path.join(dir, 'pm2') },
    stdio: ['ignore', 'ignore', 'inherit'],
  });
  try {
    const instances = () => childrenOf(runtime.pid);
    let leader = await tickingFrom(file, (p) => instances().includes(p));
    const killed = [];
    for (let i = 0; i < 2; i++) leader = await killAndFollow(file, leader, killed, instances);
    const deadline = Date.now() + STEP;
    while (instances().length < 4 && Date.now() < deadline) await sleep(20);
    assert.equal(instances().length, 4, 'PM2 restarted the killed instances');
    await sleep(1500);
    assert.deepEqual(runs(file), [...killed, leader], 'each leader ticked in one run, the restarted ones follow');
    // pm2-runtime stops every instance with SIGINT (pm2-app.js stops its
    // elector) and exits.
    const exited = new Promise((r) => runtime.once('exit', r));
    runtime.kill('SIGINT');
    await exited;
    assert.deepEqual(instances(), []);
    assert.equal(sidelease.inspect(db).state, 'free');
  } finally {
    if (runtime.exitCode === null && runtime.signalCode === null) {
      for (const p of childrenOf(runtime.pid)) process.kill(p, 'SIGKILL');
      runtime.kill('SIGKILL');
    }
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('Bun: 4 Bun.serve processes on one port (reusePort), the cron job in one at a time', { timeout: 60_000 }, async () => {
  const { dir, db, ticks: file } = files();
  const port = await freePort();
  const procs = Array.from({ length: 4 }, () =>
    spawn(BUN, [path.join(here, 'bun-reuseport.js')], {
      env: { ...process.env, APP_DB: db, APP_TICKS: file, PORT: String(port), SIDELEASE_MODULE: MODULE },
      stdio: ['ignore', 'ignore', 'inherit'],
    }),
  );
  try {
    const alive = () => procs.filter((p) => p.exitCode === null && p.signalCode === null).map((p) => p.pid);
    let leader = await tickingFrom(file, (p) => alive().includes(p));
    const killed = [];
    for (let i = 0; i < 2; i++) leader = await killAndFollow(file, leader, killed, alive);
    await sleep(1500);
    assert.deepEqual(runs(file), [...killed, leader]);
    const answers = await Promise.all(Array.from({ length: 16 }, () => get(port)));
    for (const a of answers) assert.equal(a.leading, a.pid === leader, JSON.stringify(a));
    await Promise.all(procs.filter((p) => alive().includes(p.pid)).map((p) => new Promise((r) => { p.once('exit', r); p.kill('SIGTERM'); })));
    assert.equal(sidelease.inspect(db).state, 'free');
  } finally {
    for (const p of procs) if (p.exitCode === null && p.signalCode === null) p.kill('SIGKILL');
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
