// The JavaScript agent, run by Node and by Bun (see tests/PROTOCOL.md).
'use strict';
const fs = require('node:fs');
const path = require('node:path');
const readline = require('node:readline');
const sidelease = require(path.join(__dirname, '..', '..', 'bindings-node', 'index.js'));

const RUNTIME = process.versions.bun ? 'bun' : 'node';
const KINDS = {
  SIDELEASE_IN_USE: 'in_use',
  SIDELEASE_TIMEOUT: 'timeout',
  SIDELEASE_UNSUPPORTED_FS: 'unsupported_fs',
  SIDELEASE_INVALID_ARGUMENT: 'invalid_argument',
  SIDELEASE_IO: 'io',
  ABORT_ERR: 'cancelled',
  SIDELEASE_LOST: 'lost',
};
const SNAKE = {
  leasePath: 'lease_path', recordStatus: 'record_status',
  backendPid: 'backend_pid', clientAddr: 'client_addr', applicationName: 'application_name',
};

function say(v) {
  fs.writeSync(1, JSON.stringify(v) + '\n');
}

function error(e) {
  const err = { kind: KINDS[e.code] || 'other', message: e.message };
  if (e.code === 'SIDELEASE_IN_USE' || e.code === 'SIDELEASE_TIMEOUT') {
    err.holder = e.holder;
    err.holders = e.holders;
  }
  if (typeof e.errno === 'number') err.errno = -e.errno;
  return { ok: false, error: err };
}

function options(cmd) {
  const o = {};
  if ('timeout' in cmd) o.timeout = cmd.timeout === null ? Infinity : cmd.timeout * 1000;
  if ('suffix' in cmd) o.suffix = cmd.suffix;
  if ('metadata' in cmd) o.metadata = cmd.metadata;
  if ('split_guard' in cmd) o.splitGuard = cmd.split_guard;
  if ('watch' in cmd) o.watch = cmd.watch;
  return o;
}

function stress(cmd) {
  const me = String(process.pid);
  let done = 0, overlaps = 0, timeouts = 0, lost = 0;
  for (let i = 0; i < cmd.iterations; i++) {
    let lease;
    try {
      lease = sidelease.acquire(cmd.target, { timeout: cmd.timeout * 1000, splitGuard: cmd.split_guard !== false });
    } catch (e) {
      if (e.code === 'SIDELEASE_TIMEOUT') { timeouts++; continue; }
      throw e;
    }
    if (fs.readFileSync(cmd.owner, 'utf8').trim() !== '-') overlaps++;
    fs.writeFileSync(cmd.owner, me);
    const n = Number(fs.readFileSync(cmd.counter, 'utf8') || 0);
    fs.writeFileSync(cmd.counter, String(n + 1));
    if (fs.readFileSync(cmd.owner, 'utf8').trim() !== me) overlaps++;
    fs.writeFileSync(cmd.owner, '-');
    if (lease.state === 'lost') lost++;
    lease.release();
    done++;
  }
  return { ok: true, done, overlaps, timeouts, lost };
}

function state(lease) {
  return { ok: true, state: lease.state, reason: lease.state === 'lost' ? lease.signal.reason.reason : null };
}

// Waits on `lease.signal`'s abort event (the agent answers asynchronously,
// so the next command waits for this answer: the runner never pipelines).
function waitLost(lease, timeout) {
  const start = performance.now();
  const signal = lease.signal;
  const answer = (lost) => {
    clearTimeout(timer);
    signal.removeEventListener('abort', onAbort);
    say({ ...state(lease), lost, elapsed_ms: performance.now() - start });
  };
  const onAbort = () => answer(signal.reason && signal.reason.code === 'SIDELEASE_LOST');
  const timer = setTimeout(() => answer(false), timeout * 1000);
  if (signal.aborted) return onAbort();
  signal.addEventListener('abort', onAbort);
}

const handles = new Map();
say({ event: 'ready', pid: process.pid, runtime: RUNTIME, execs: 0 });
const rl = readline.createInterface({ input: process.stdin });
rl.on('line', (line) => {
  if (!line.trim()) return;
  const cmd = JSON.parse(line);
  try {
    switch (cmd.cmd) {
      case 'ping': return say({ ok: true, pid: process.pid });
      case 'acquire': {
        const lease = sidelease.acquire(cmd.target, options(cmd));
        const h = handles.size + 1;
        handles.set(h, lease);
        return say({
          ok: true, handle: h, lease_path: lease.leasePath, target: lease.target, generation: lease.generation,
          record: lease.record, previous: lease.previous, previous_released_cleanly: lease.previousReleasedCleanly,
          record_written: lease.recordWritten,
        });
      }
      case 'release': handles.get(cmd.handle).release(); return say({ ok: true });
      case 'check': return say({ ok: true, check: handles.get(cmd.handle).check() });
      case 'ensure': handles.get(cmd.handle).ensureHeld(); return say({ ok: true });
      case 'ensure_now':
        return handles.get(cmd.handle).ensureHeldNow().then(() => say({ ok: true }), (e) => say(error(e)));
      case 'state': return say(state(handles.get(cmd.handle)));
      case 'wait_lost': return waitLost(handles.get(cmd.handle), 'timeout' in cmd ? cmd.timeout : 5);
      case 'inspect': {
        const i = sidelease.inspect(cmd.target, 'suffix' in cmd ? { suffix: cmd.suffix } : undefined);
        const out = {};
        for (const [k, v] of Object.entries(i)) out[SNAKE[k] || k] = v;
        if (out.server) out.server = Object.fromEntries(Object.entries(out.server).map(([k, v]) => [SNAKE[k] || k, v]));
        return say({ ok: true, inspect: out });
      }
      case 'exec_self':
      case 'fork_child':
        return say({ ok: false, error: { kind: 'unsupported', message: `${RUNTIME} cannot ${cmd.cmd.replace('_', ' ')}` } });
      case 'crash': return process.kill(process.pid, 'SIGKILL');
      case 'exit': return process.exit(cmd.code || 0);
      case 'stress': return say(stress(cmd));
      default: return say({ ok: false, error: { kind: 'protocol', message: `unknown command ${cmd.cmd}` } });
    }
  } catch (e) {
    return say(error(e));
  }
});
