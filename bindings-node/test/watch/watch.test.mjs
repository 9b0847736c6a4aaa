// The process-image case (seeds/004): `bun --watch` restarts a program by
// execve in the same PID, 20 times; every new image must take the lease at
// once (no in-use refusal) and inspect must never call the old image's
// record a live holder. `node --watch` does the same with a new PID each time.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';

import { here, tmpdir } from '../helpers.mjs';

const EDITS = 20;
const BUN = path.join(here, '..', 'node_modules', '@oven', 'bun-linux-x64', 'bin', 'bun');
const NODE = process.versions.bun ? 'node' : process.execPath;
const INDEX = path.join(here, '..', 'index.js');

function appSource(version, db, log, bun) {
  return `const VERSION = ${version};
const fs = require('node:fs');
const sidelease = require(${JSON.stringify(INDEX)});
const before = sidelease.inspect(${JSON.stringify(db)});
const entry = { version: VERSION, pid: process.pid, before: before.recordStatus, beforeHolders: before.holders };
try {
  const lease = sidelease.acquire(${JSON.stringify(db)});
  globalThis.lease = lease;
  Object.assign(entry, { ok: true, generation: lease.generation, previousPid: lease.previous && lease.previous.pid });
} catch (e) {
  Object.assign(entry, { ok: false, code: e.code, message: e.message });
}
fs.appendFileSync(${JSON.stringify(log)}, JSON.stringify(entry) + '\\n');
${bun ? "Bun.serve({ port: 0, hostname: '127.0.0.1', fetch: () => new Response('ok') });" : 'setInterval(() => {}, 1000);'}
`;
}

function readLog(log) {
  if (!fs.existsSync(log)) return [];
  return fs.readFileSync(log, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l));
}

async function waitForVersion(log, version, proc) {
  const deadline = Date.now() + 15_000;
  for (;;) {
    const entry = readLog(log).find((e) => e.version === version);
    if (entry) return entry;
    if (proc.exitCode !== null) throw new Error(`watcher exited: ${proc.exitCode}`);
    if (Date.now() > deadline) throw new Error(`image ${version} never started; log: ${fs.readFileSync(log, 'utf8')}`);
    await new Promise((r) => setTimeout(r, 10)); // polling a log file we read only
  }
}

async function runWatch(runtime, bun) {
  const dir = tmpdir();
  const db = path.join(dir, 'app.db');
  const log = path.join(dir, 'log.jsonl');
  const app = path.join(dir, 'app.js');
  fs.writeFileSync(app, appSource(0, db, log, bun));
  const proc = spawn(runtime, ['--watch', app], { stdio: ['ignore', 'ignore', 'inherit'], cwd: dir });
  try {
    await waitForVersion(log, 0, proc);
    for (let v = 1; v <= EDITS; v++) {
      await new Promise((r) => setTimeout(r, 60)); // let the watcher settle between edits
      fs.writeFileSync(app, appSource(v, db, log, bun));
      await waitForVersion(log, v, proc);
    }
    return readLog(log);
  } finally {
    const pids = new Set(readLog(log).map((e) => e.pid));
    proc.kill('SIGTERM');
    await new Promise((r) => (proc.exitCode !== null ? r() : proc.once('exit', r)));
    for (const pid of pids) {
      try { process.kill(pid, 'SIGKILL'); } catch { /* already gone */ }
    }
  }
}

function checkImages(entries) {
  const refused = entries.filter((e) => !e.ok);
  assert.deepEqual(refused, [], 'an image was refused the lease');
  const live = entries.filter((e) => e.before === 'live');
  assert.deepEqual(live, [], 'inspect called a replaced image a live holder');
  const versions = entries.map((e) => e.version);
  assert.deepEqual([...new Set(versions)].sort((a, b) => a - b), Array.from({ length: EDITS + 1 }, (_, i) => i));
}

test('bun --watch: 20 restarts in one PID, each image takes the lease at once', async () => {
  const entries = await runWatch(BUN, true);
  checkImages(entries);
  assert.equal(new Set(entries.map((e) => e.pid)).size, 1, 'bun --watch keeps the PID');
  for (const e of entries.slice(1)) {
    assert.equal(e.before, 'image-replaced', JSON.stringify(e));
    assert.equal(e.previousPid, entries[0].pid);
  }
  // One more per image, from the first (the clock: issue 35).
  assert.equal(entries.at(-1).generation, entries[0].generation + entries.length - 1);
});

test('node --watch: 20 restarts in new PIDs, each takes the lease at once', async () => {
  const entries = await runWatch(NODE, false);
  checkImages(entries);
  assert.equal(new Set(entries.map((e) => e.pid)).size, entries.length, 'node --watch starts a new process');
  for (const e of entries.slice(1)) assert.ok(['stale', 'released'].includes(e.before), JSON.stringify(e));
});
