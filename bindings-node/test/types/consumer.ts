// Compiled with `tsc --noEmit --strict` by tests/run: what a TypeScript user
// writes must type-check, and what must not compile must not.
import { acquire, acquireAsync, Elector, inspect, lead, Lease, SideleaseError } from '../../index';

export async function use(db: string): Promise<number | null> {
  const lease: Lease = acquire(db, { timeout: 100, metadata: { app: 'api' } });
  const state: 'held' | 'lost' | 'released' = lease.state;
  const signal: AbortSignal = lease.signal;
  lease.release();
  const again = await acquireAsync(new URL(`file://${db}`), { timeout: null, signal });
  const named = await acquireAsync(db, { timeout: 1000, onWaiting: (w) => { const pids: number[] = w.holders; void pids; } });
  named.release();
  // @ts-expect-error a sync acquire blocks the loop: it reports no progress
  acquire(db, { timeout: 1, onWaiting: () => {} });
  const asked: Promise<void> = again.ensureHeldNow();
  await asked;
  const info = inspect(db);
  const free: boolean = info.state === 'free';
  again.release();
  try {
    acquire(db);
  } catch (e) {
    if (e instanceof SideleaseError && e.code === 'SIDELEASE_IN_USE') {
      const holders: number[] | undefined = e.holders;
      void holders;
      void JSON.stringify(e.toJSON());
    }
  }
  void state;
  void free;
  return again.generation;
}

// @ts-expect-error a lease comes from acquire(), never from its constructor
new Lease();

// @ts-expect-error ensureHeldNow() is asynchronous: its result is no boolean
const now: boolean = acquire('app.db').ensureHeldNow();
void now;

// @ts-expect-error unknown options do not type-check (and are refused at run time)
acquire('app.db', { timout: 5000 });

async function elect(signal: AbortSignal): Promise<number> {
  const e = new Elector('app.db', { signal });
  e.on('elected', ({ lease, signal: term }) => {
    const g: number | null = lease.generation;
    void g;
    void term.aborted;
  });
  e.on('stepped-down', ({ why }) => {
    const w: 'lost' | 'released' | 'stopped' | 'error' = why;
    void w;
  });
  e.on('waiting', ({ holder }) => void holder?.pid);
  await e.run(async (lease, term) => {
    term.throwIfAborted();
    lease.ensureHeld();
  });
  await lead('app.db', async (lease) => lease.generation, { signal });
  return e.snapshot.elections;
}
void elect;

// @ts-expect-error an elector waits until elected or stopped: no timeout
new Elector('app.db', { timeout: 5 });
