'use strict';
// Leader election for Node and Bun on the core's elector: `Elector` (an
// EventEmitter for long-running services) and `lead(target, work)`. Every
// event is also published on a `diagnostics_channel` channel named
// `sidelease:<event>`.

const { EventEmitter } = require('node:events');
const diagnostics = require('node:diagnostics_channel');

const EVENTS = ['waiting', 'elected', 'lost', 'stepped-down', 'retrying', 'stopped'];
const channels = Object.fromEntries(EVENTS.map((e) => [e, diagnostics.channel(`sidelease:${e}`)]));

module.exports = function electors(core) {
  const { native, ENV, newLease, call, fromNative, targetArg, nativeOptions, typeError, invalidArgument, SideleaseError } = core;

  function stoppedError() {
    const e = new SideleaseError('the elector was stopped', { code: 'ABORT_ERR' });
    e.name = 'AbortError';
    return e;
  }

  function describe(err) {
    if (err instanceof Error) return err.message ? `${err.name}: ${err.message}` : err.name;
    return String(err);
  }

  function aborted(signal) {
    return new Promise((resolve) => {
      if (signal.aborted) resolve();
      else signal.addEventListener('abort', () => resolve(), { once: true });
    });
  }

  class Elector extends EventEmitter {
    #id;
    #stopped = false;
    #running = null;
    #controller = null;
    // The last snapshot, once stopped (the native elector is closed then).
    #final = null;

    /**
     * Campaigns for the lease of `target` again and again, until stopped.
     * `options` are acquireAsync's, without `timeout` (a campaign waits
     * until elected); `options.signal` stops the elector.
     */
    constructor(target, options) {
      super();
      const t = targetArg(target);
      let rest = options;
      let signal;
      if (options !== undefined && options !== null) {
        if (typeof options !== 'object' || Array.isArray(options)) throw typeError('options', 'an object', options);
        if (options.onWaiting !== undefined) {
          throw invalidArgument('options.onWaiting', "an elector tells who it waits for as 'waiting' events: listen to them");
        }
        if (options.timeout !== undefined) {
          throw invalidArgument('options.timeout', 'an elector waits until it is elected or stopped; stop it with options.signal');
        }
        ({ signal, ...rest } = options);
        if (signal !== undefined && !(signal instanceof AbortSignal)) throw typeError('options.signal', 'an AbortSignal', signal);
      }
      const o = nativeOptions(rest);
      this.#id = call(native.electorOpen, ENV, t, o, (json) => {
        const { kind, ...info } = JSON.parse(json);
        this.#tell(kind, info);
      });
      if (signal) {
        if (signal.aborted) this.stop();
        else signal.addEventListener('abort', () => this.stop(), { once: true });
      }
    }

    #tell(kind, info) {
      const channel = channels[kind];
      if (channel.hasSubscribers) channel.publish(info);
      this.emit(kind, info);
    }

    /** leading, generation, leaderSince (ms since the epoch), elections, losses, failures. */
    get snapshot() {
      return this.#final ?? JSON.parse(call(native.electorSnapshot, this.#id));
    }

    get isLeader() {
      return this.snapshot.leading;
    }

    get stopped() {
      return this.#stopped;
    }

    /**
     * The loop: campaign, `await work(lease, signal)` while leading (the
     * signal aborts on loss or stop), step down when it settles, campaign
     * again, until stopped. Without `work`, each term lasts until the
     * lease is lost or the elector stopped. Resolves once stopped.
     */
    run(work) {
      if (work !== undefined && typeof work !== 'function') throw typeError('work', 'a function', work);
      if (this.#running) throw invalidArgument('elector', 'is running already (one loop per elector)');
      if (this.#final) return Promise.resolve(); // stopped, and closed
      this.#running = this.#loop(work);
      return this.#running;
    }

    /** run() in the background; a campaign error it cannot retry is emitted as 'error'. */
    start(work) {
      this.run(work).catch((err) => this.emit('error', err));
      return this;
    }

    /** Stop campaigning, abort the current term's signal; resolves once it stepped down. */
    stop() {
      if (!this.#stopped) {
        this.#stopped = true;
        call(native.electorStop, this.#id);
        if (this.#controller && !this.#controller.signal.aborted) this.#controller.abort(stoppedError());
        if (!this.#running) this.#close(); // never run: nothing else will
      }
      return this.#running ? this.#running.then(() => undefined, () => undefined) : Promise.resolve();
    }

    async #loop(work) {
      try {
        for (;;) {
          let won;
          try {
            won = await native.electorCampaign(ENV, this.#id);
          } catch (err) {
            throw fromNative(err);
          }
          if (won === null) break;
          await this.#term(won[0], newLease(won[1]), work);
        }
      } finally {
        this.#running = null;
        if (this.#stopped) this.#close();
      }
    }

    // Closing frees the native elector and its listener (this object).
    #close() {
      this.#final = JSON.parse(call(native.electorSnapshot, this.#id));
      native.electorClose(this.#id);
      this.#tell('stopped', {});
    }

    async #term(termId, lease, work) {
      const controller = new AbortController();
      this.#controller = controller;
      const onLost = () => {
        if (controller.signal.aborted) return;
        const error = lease.signal.reason;
        controller.abort(error);
        this.#tell('lost', { reason: error && error.reason, error });
      };
      lease.signal.addEventListener('abort', onLost, { once: true });
      if (lease.signal.aborted) onLost();
      if (this.#stopped && !controller.signal.aborted) controller.abort(stoppedError());
      // A term keeps the process alive, as a listening server does (a
      // campaign does too: its native wait is pending); stop() ends it.
      const alive = setInterval(() => {}, 1 << 30);
      let failure = null;
      try {
        this.#tell('elected', { generation: lease.generation, lease, signal: controller.signal });
        // Stopped as it was elected (before this term began): the work is
        // not started, and the lease is released before stop() resolves.
        if (!this.#stopped) {
          if (work) await work(lease, controller.signal);
          else await aborted(controller.signal);
        }
      } catch (err) {
        // Work that ends by throwing its signal's reason ended as told.
        if (!(controller.signal.aborted && err === controller.signal.reason)) failure = err;
      } finally {
        clearInterval(alive);
        lease.signal.removeEventListener('abort', onLost);
        this.#controller = null;
        try {
          lease.release();
        } catch {
          // The handle ends all the same; the term's step-down says why.
        }
        const [why, detail] = call(native.termStepDown, termId, failure === null ? null : describe(failure));
        this.#tell('stepped-down', { why, detail, error: failure });
      }
    }
  }

  /**
   * Lead whenever elected, until `options.signal` aborts: `await
   * work(lease, signal)` runs each time this process is elected; `signal`
   * aborts on loss (its reason the SIDELEASE_LOST error) or stop. When
   * the work settles, the process steps down and campaigns again.
   */
  async function lead(target, work, options) {
    if (typeof work !== 'function') throw typeError('work', 'a function', work);
    await new Elector(target, options).run(work);
  }

  return { Elector, lead };
};
