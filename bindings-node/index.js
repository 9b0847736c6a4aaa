'use strict';
// The public face of the `sidelease` package for Node and Bun. The native
// addon does the work; this file checks argument types, turns native errors
// into SideleaseError objects with data fields (the one place errors are
// converted), and adds AbortSignal and Symbol.dispose support.

const native = loadAddon();

// The addon: built here from source, or else from the platform package
// (@sidelease/linux-x64-gnu, @sidelease/darwin-arm64, ...), an optional
// dependency npm installs only on the platform it fits; the names are
// napi-rs's (packaging/npm-stage.mjs lists them).
function loadAddon() {
  const built = ['linux-x64-gnu', 'linux-arm64-gnu', 'linux-x64-musl', 'linux-arm64-musl', 'darwin-arm64', 'darwin-x64'];
  const platform = platformName();
  const local = require('node:path').join(__dirname, `sidelease.${platform}.node`);
  if (require('node:fs').existsSync(local)) return require(local);
  const pkg = `@sidelease/${platform}`;
  try {
    return require(pkg);
  } catch (err) {
    if (err.code !== 'MODULE_NOT_FOUND' || !String(err.message).includes(pkg)) throw err;
    const hint = built.includes(platform)
      ? `npm installs it with sidelease as an optional dependency: install again without --omit=optional or --no-optional`
      : `sidelease is built for ${built.join(', ')} only`;
    const e = new Error(`sidelease: no native addon for ${platform}: the package ${pkg} is not installed (${hint})`);
    e.code = 'ERR_SIDELEASE_NO_ADDON';
    throw e;
  }
}

function platformName() {
  const { platform, arch } = process;
  return platform === 'linux' ? `linux-${arch}-${isMusl() ? 'musl' : 'gnu'}` : `${platform}-${arch}`;
}

// Which C library this Linux runs, as napi-rs's loaders tell: an addon built
// for the other one does not load.
function isMusl() {
  const fs = require('node:fs');
  // ldd is a script naming its libc (cheaper than process.report).
  try {
    return fs.readFileSync('/usr/bin/ldd', 'latin1').includes('musl');
  } catch {
    // No ldd (a distroless or scratch image).
  }
  // Node's report names the glibc it runs on, or lists musl's loader.
  try {
    process.report.excludeNetwork = true;
    const report = process.report.getReport();
    if (report.header && report.header.glibcVersionRuntime) return false;
    const objects = Array.isArray(report.sharedObjects) ? report.sharedObjects : [];
    if (objects.some((f) => f.includes('libc.musl-') || f.includes('ld-musl-'))) return true;
  } catch {
    // No report (it is Node's).
  }
  // Bun's report says neither: the runtime's own program loader does, in
  // the ELF header's first page.
  try {
    const fd = fs.openSync(process.execPath, 'r');
    try {
      const head = Buffer.alloc(4096);
      const n = fs.readSync(fd, head, 0, head.length, 0);
      return head.subarray(0, n).includes('/ld-musl-');
    } finally {
      fs.closeSync(fd);
    }
  } catch {
    return false;
  }
}

const RUNTIME = process.versions.bun ? `bun ${process.versions.bun}` : `node ${process.versions.node}`;
const dispose = Symbol.dispose || Symbol.for('nodejs.dispose');
native.setRuntime(RUNTIME);

class SideleaseError extends Error {
  constructor(message, fields) {
    super(message);
    this.name = 'SideleaseError';
    Object.assign(this, fields);
  }

  // JSON.stringify would otherwise drop `message` (an own, non-enumerable
  // property of every Error) and keep only the data fields.
  toJSON() {
    return { name: this.name, message: this.message, ...this };
  }
}

function fromNative(err) {
  let payload;
  try {
    payload = JSON.parse(err.message);
  } catch {
    return err; // not ours (a napi argument error, say)
  }
  if (!payload || typeof payload.code !== 'string') return err;
  const { message, ...fields } = payload;
  const e = new SideleaseError(message, fields);
  if (fields.code === 'ABORT_ERR') e.name = 'AbortError';
  return e;
}

function call(fn, ...args) {
  try {
    return fn(...args);
  } catch (err) {
    throw fromNative(err);
  }
}

function typeError(name, expected, value) {
  const got = value === null ? 'null' : Array.isArray(value) ? 'an array' : typeof value;
  const e = new TypeError(`The "${name}" argument must be ${expected}. Received ${got}`);
  e.code = 'ERR_INVALID_ARG_TYPE';
  return e;
}

function targetArg(target) {
  if (typeof target === 'string' && target.startsWith('file://')) target = new URL(target);
  if (target instanceof URL) {
    if (target.protocol === 'postgresql:' || target.protocol === 'postgres:') return target.href;
    if (target.protocol !== 'file:') throw typeError('target', 'a string, a file: URL or a postgresql: URL', target);
    return require('node:url').fileURLToPath(target);
  }
  if (typeof target !== 'string') throw typeError('target', 'a string, a file: URL or a postgresql: URL', target);
  return target;
}

const OPTION_NAMES = new Set(['timeout', 'suffix', 'metadata', 'allowUnsupportedFs', 'splitGuard', 'watch', 'signal', 'onWaiting']);

function invalidArgument(argument, message) {
  return new SideleaseError(`invalid argument \`${argument}\`: ${message}`, {
    code: 'SIDELEASE_INVALID_ARGUMENT',
    argument,
  });
}

// Metadata must be JSON as it is, not what JSON.stringify would quietly make
// of it (a Map becomes {}, NaN null, undefined disappears): the same values
// are refused in every language, naming where they are.
function checkJson(value, where, depth) {
  if (depth > 100) throw invalidArgument('metadata', `nests deeper than 100 levels at ${where}`);
  if (value === null || typeof value === 'string' || typeof value === 'boolean') return;
  if (typeof value === 'number') {
    if (!Number.isFinite(value)) throw invalidArgument('metadata', `${where} is ${value}, which JSON cannot hold`);
    return;
  }
  if (Array.isArray(value)) {
    value.forEach((v, i) => checkJson(v, `${where}[${i}]`, depth + 1));
    return;
  }
  if (typeof value === 'object') {
    const proto = Object.getPrototypeOf(value);
    if (proto !== Object.prototype && proto !== null) {
      const kind = (value.constructor && value.constructor.name) || 'an object with a prototype';
      throw invalidArgument('metadata', `${where} is a ${kind}, not a plain object, array or JSON value`);
    }
    for (const [k, v] of Object.entries(value)) checkJson(v, `${where}.${k}`, depth + 1);
    return;
  }
  throw invalidArgument('metadata', `${where} is ${typeof value === 'bigint' ? 'a bigint' : typeof value}, which JSON cannot hold`);
}

function nativeOptions(options) {
  if (options === undefined || options === null) return undefined; // the defaults, set natively
  if (typeof options !== 'object' || Array.isArray(options)) throw typeError('options', 'an object', options);
  for (const name of Object.keys(options)) {
    if (!OPTION_NAMES.has(name)) {
      throw invalidArgument('options', `unknown option \`${name}\` (known: ${[...OPTION_NAMES].join(', ')})`);
    }
  }
  const out = {};
  const { timeout, suffix, metadata, allowUnsupportedFs, splitGuard, watch, signal } = options;
  if (timeout === null) {
    out.timeout = Infinity; // as None in Python: no limit
  } else if (timeout !== undefined) {
    if (typeof timeout !== 'number') throw typeError('options.timeout', 'a number', timeout);
    out.timeout = timeout;
  }
  if (suffix !== undefined) {
    if (typeof suffix !== 'string') throw typeError('options.suffix', 'a string', suffix);
    out.suffix = suffix;
  }
  if (metadata !== undefined && metadata !== null) {
    if (typeof metadata !== 'object' || Array.isArray(metadata)) {
      throw typeError('options.metadata', 'a plain object', metadata);
    }
    checkJson(metadata, 'metadata', 0);
    out.metadataJson = JSON.stringify(metadata);
  }
  if (allowUnsupportedFs !== undefined) {
    if (typeof allowUnsupportedFs !== 'boolean') throw typeError('options.allowUnsupportedFs', 'a boolean', allowUnsupportedFs);
    out.allowUnsupportedFs = allowUnsupportedFs;
  }
  if (splitGuard !== undefined) {
    if (typeof splitGuard !== 'boolean') throw typeError('options.splitGuard', 'a boolean', splitGuard);
    out.splitGuard = splitGuard;
  }
  if (watch !== undefined) {
    if (typeof watch !== 'boolean') throw typeError('options.watch', 'a boolean', watch);
    out.watch = watch;
  }
  if (signal !== undefined && !(signal instanceof AbortSignal)) throw typeError('options.signal', 'an AbortSignal', signal);
  const { onWaiting } = options;
  if (onWaiting !== undefined && typeof onWaiting !== 'function') throw typeError('options.onWaiting', 'a function', onWaiting);
  return out;
}

// A lease handle: a plain object with the native handle's number. release()
// frees the native state at once and answers what the acquisition learned
// (one JSON text, parsed only if a field is read after release), so every
// field reads the same before and after release, whatever was read before.
const NEW_LEASE = Symbol('sidelease.newLease');
const { isMainThread } = require('node:worker_threads');
const diagnostics = require('node:diagnostics_channel');

const waitingChannel = diagnostics.channel('sidelease:waiting');
// A plain lease's life, for whoever subscribes (an elector's terms publish
// elected, lost and stepped-down instead): { lease, target } and, for a
// loss, its reason and error. Only a lease acquired while sidelease:lost
// has a subscriber is watched for it.
const acquiredChannel = diagnostics.channel('sidelease:acquired');
const releasedChannel = diagnostics.channel('sidelease:released');
const lostChannel = diagnostics.channel('sidelease:lost');

function announce(lease) {
  if (acquiredChannel.hasSubscribers) acquiredChannel.publish({ lease, target: lease.target, generation: lease.generation });
  if (lostChannel.hasSubscribers) {
    const target = lease.target;
    const signal = lease.signal;
    signal.addEventListener('abort', () => {
      lostChannel.publish({ lease, target, reason: signal.reason.reason, error: signal.reason });
    }, { once: true });
  }
  return lease;
}
// This environment's number: a worker's handles are released, and its
// waits cancelled, when the worker is torn down.
const ENV = native.envOpen(isMainThread);

function lostError(message, reason, leasePath) {
  return new SideleaseError(message, { code: 'SIDELEASE_LOST', reason, leasePath });
}

// Fields the native side answers as JSON text (record, previous): their
// getters parse it, so every read gives a fresh object.
const JSON_FIELDS = new Set(['record', 'previous']);

class Lease {
  #id;
  #released = false;
  #cache = null;
  // After release: what the acquisition learned, as JSON text, then parsed.
  #facts = null;
  #signal = null;
  // The signal's controller while it can still abort (held, not aborted).
  #controller = null;

  /** Not constructible: a lease comes from acquire() or acquireAsync(). */
  constructor(token, id) {
    if (token !== NEW_LEASE) {
      throw new SideleaseError('invalid argument `lease`: a Lease comes from acquire() or acquireAsync(), not from new Lease()', {
        code: 'SIDELEASE_INVALID_ARGUMENT',
        argument: 'lease',
      });
    }
    this.#id = id;
  }

  // A field that never changes (what the acquisition learned), cached on
  // first read; after release, from what release() answered.
  #field(name, get) {
    const c = this.#cache;
    if (c !== null && name in c) return c[name];
    if (this.#released) return this.#known(name);
    const v = call(get, this.#id);
    (this.#cache ??= {})[name] = v;
    return v;
  }

  #known(name) {
    if (this.#facts === null) {
      // Released elsewhere (its worker's environment was torn down).
      throw new SideleaseError(`invalid argument \`lease\`: this lease handle was released with its environment; lease.${name} is not known`, {
        code: 'SIDELEASE_INVALID_ARGUMENT',
        argument: 'lease',
      });
    }
    if (typeof this.#facts === 'string') this.#facts = JSON.parse(this.#facts);
    const v = this.#facts[name];
    return JSON_FIELDS.has(name) ? JSON.stringify(v) : v;
  }

  /** Release this handle's share; a second call does nothing. */
  release() {
    if (this.#released) return;
    // A loss not yet told to the signal (its callback is on the way) is
    // told now: the signal says after release what it would have before.
    this.#lostSeen();
    this.#controller = null;
    const target = releasedChannel.hasSubscribers ? this.target : null;
    try {
      this.#facts = native.release(this.#id);
      if (target !== null) releasedChannel.publish({ lease: this, target });
    } catch (err) {
      // A failed release still ends the handle (the core marks it first),
      // and what it learned stays readable.
      this.#facts = native.takeFacts(this.#id);
      throw fromNative(err);
    } finally {
      this.#released = true;
    }
  }

  /** 'held', 'unlinked' or 'replaced'. */
  check() {
    return call(native.check, this.#id);
  }

  /** Throws the SIDELEASE_LOST error if the lease was lost. */
  ensureHeld() {
    try {
      call(native.ensureHeld, this.#id);
    } catch (err) {
      this.#lostNow(err);
      throw err;
    }
  }

  // A loss this thread just learned of aborts the signal now, before the
  // caller hears of it (the native callback reaches the loop later).
  #lostNow(err) {
    const c = this.#controller;
    if (c !== null && err && err.code === 'SIDELEASE_LOST' && !c.signal.aborted) {
      this.#controller = null;
      c.abort(err);
    }
  }

  #lostSeen() {
    if (this.#controller === null || call(native.state, this.#id) !== 'lost') return;
    try {
      call(native.ensureHeld, this.#id);
    } catch (err) {
      this.#lostNow(err);
    }
  }

  /**
   * As ensureHeld(), and for a PostgreSQL lease ask the server now (one
   * round trip within the lease's bound) instead of relying on the last
   * heartbeat. Rejects with SIDELEASE_LOST, or SIDELEASE_IO when the answer
   * did not come in time (not known yet).
   */
  async ensureHeldNow() {
    try {
      await native.ensureHeldNow(this.#id);
    } catch (err) {
      const e = fromNative(err);
      if (!this.#released) this.#lostNow(e);
      throw e;
    }
  }

  /** Call `callback(message)` on this thread's event loop when the lease is lost. */
  onLost(callback) {
    if (typeof callback !== 'function') throw typeError('callback', 'a function', callback);
    call(native.onLost, this.#id, callback);
  }

  get released() {
    return this.#released;
  }

  /** 'held', 'lost' (see `signal`) or 'released'. */
  get state() {
    if (this.#released) return 'released';
    const s = call(native.state, this.#id);
    if (s === 'lost' && this.#controller !== null) this.#lostSeen();
    return s;
  }

  /** Why the lease was lost, or null; the same after release() as before. */
  get lostReason() {
    if (this.#released) return this.#facts === null ? null : this.#known('lostReason');
    const r = call(native.lostReason, this.#id);
    if (r !== null) this.#lostSeen();
    return r;
  }

  get leasePath() {
    return this.#field('leasePath', native.leasePath);
  }

  get target() {
    return this.#field('target', native.target);
  }

  get generation() {
    return this.#field('generation', native.generation);
  }

  get previousReleasedCleanly() {
    return this.#field('previousReleasedCleanly', native.previousReleasedCleanly);
  }

  get recordWritten() {
    return this.#field('recordWritten', native.recordWritten);
  }

  /** The record this acquisition wrote (a fresh object on every read). */
  get record() {
    return JSON.parse(this.#field('record', native.recordJson));
  }

  /** The record the previous holder left, or null. */
  get previous() {
    return JSON.parse(this.#field('previous', native.previousJson));
  }

  /**
   * An AbortSignal aborted (with a SIDELEASE_LOST error as its reason) when
   * the lease is lost while held. Watching it never keeps the loop alive.
   */
  get signal() {
    if (this.#signal) return this.#signal;
    const controller = new AbortController();
    this.#signal = controller.signal;
    if (this.#released) {
      // As it would have been read before the release.
      const reason = this.lostReason;
      if (reason !== null) controller.abort(lostError(this.#known('lostMessage'), reason, this.leasePath));
      return this.#signal;
    }
    const leasePath = this.leasePath;
    const abort = (message) => {
      // Released meanwhile: it was not lost then, and stays so.
      if (this.#released || controller.signal.aborted) return;
      this.#controller = null;
      controller.abort(lostError(message, this.lostReason, leasePath));
    };
    this.#controller = controller;
    if (call(native.state, this.#id) === 'lost') {
      this.#lostSeen();
    } else {
      this.onLost(abort);
    }
    return this.#signal;
  }

  [dispose]() {
    this.release();
  }

  [Symbol.for('nodejs.util.inspect.custom')]() {
    let target;
    try {
      target = this.target;
    } catch {
      target = '?';
    }
    return `Lease { target: '${target}', ${this.#released ? 'released' : 'held'} }`;
  }
}

/** Acquire the lease of `target` (timeout in ms: 0 one attempt, Infinity forever). */
function acquire(target, options) {
  const t = targetArg(target);
  const o = nativeOptions(options);
  if (options && options.signal) throw typeError('options.signal', 'used with acquireAsync only', options.signal);
  if (options && options.onWaiting) {
    throw typeError('options.onWaiting', 'used with acquireAsync only (acquire blocks the event loop while it waits)', options.onWaiting);
  }
  try {
    return announce(new Lease(NEW_LEASE, native.acquire(ENV, t, o)));
  } catch (err) {
    throw fromNative(err);
  }
}

/** Acquire without blocking the event loop; `options.signal` cancels the wait. */
async function acquireAsync(target, options) {
  const t = targetArg(target);
  const o = nativeOptions(options);
  const signal = options && options.signal;
  if (signal && signal.aborted) throw abortError(signal);
  const cancel = new native.CancelHandle();
  const onAbort = () => cancel.cancel();
  if (signal) signal.addEventListener('abort', onAbort, { once: true });
  // Who the wait waits for: to options.onWaiting and the sidelease:waiting
  // channel, once it starts and whenever the holder changes. A throwing
  // onWaiting ends the wait with its error.
  const onWaiting = options && options.onWaiting;
  let thrown = null;
  const tell = onWaiting || waitingChannel.hasSubscribers
    ? (json) => {
        const { kind, ...info } = JSON.parse(json);
        if (waitingChannel.hasSubscribers) waitingChannel.publish(info);
        if (!onWaiting || thrown) return;
        try {
          onWaiting(info);
        } catch (err) {
          thrown = { err };
          cancel.cancel();
        }
      }
    : undefined;
  try {
    const lease = announce(new Lease(NEW_LEASE, await native.acquireAsync(ENV, t, o, cancel, tell)));
    if (thrown) {
      lease.release(); // the caller's onWaiting failed: nothing is held
      throw thrown.err;
    }
    // The abort came after the native side had the lease but before the
    // promise settled: the caller asked for nothing to be held.
    if (signal && signal.aborted) {
      try {
        lease.release();
      } catch {
        // Released all the same (the handle ends first); the abort is the answer.
      }
      throw abortError(signal);
    }
    return lease;
  } catch (err) {
    if (thrown) throw thrown.err;
    const e = fromNative(err);
    if (e.code === 'ABORT_ERR' && signal) e.cause = signal.reason;
    throw e;
  } finally {
    if (signal) signal.removeEventListener('abort', onAbort);
  }
}

function abortError(signal) {
  const e = new SideleaseError('the wait was aborted', { code: 'ABORT_ERR', cause: signal.reason });
  e.name = 'AbortError';
  return e;
}

const INSPECT_KEYS = { lease_path: 'leasePath', record_status: 'recordStatus' };
const SERVER_KEYS = { backend_pid: 'backendPid', client_addr: 'clientAddr', application_name: 'applicationName' };

/** Who holds the lease of `target`, from the kernel; never takes or disturbs it. */
function inspect(target, options) {
  const t = targetArg(target);
  let suffix;
  if (options !== undefined && options !== null) {
    if (typeof options !== 'object') throw typeError('options', 'an object', options);
    for (const name of Object.keys(options)) {
      if (name !== 'suffix') throw invalidArgument('options', `unknown option \`${name}\` (known: suffix)`);
    }
    if (options.suffix !== undefined && typeof options.suffix !== 'string') throw typeError('options.suffix', 'a string', options.suffix);
    suffix = options.suffix;
  }
  const raw = JSON.parse(call(native.inspectJson, t, suffix));
  const out = {};
  for (const [k, v] of Object.entries(raw)) out[INSPECT_KEYS[k] || k] = v;
  if (out.server) out.server = Object.fromEntries(Object.entries(out.server).map(([k, v]) => [SERVER_KEYS[k] || k, v]));
  return out;
}

const { Elector, lead } = require('./elect.js')({
  native,
  ENV,
  newLease: (handle) => new Lease(NEW_LEASE, handle),
  call,
  fromNative,
  targetArg,
  nativeOptions,
  typeError,
  invalidArgument,
  SideleaseError,
});

module.exports = { acquire, acquireAsync, inspect, Elector, lead, Lease, SideleaseError, version: require('./package.json').version };
