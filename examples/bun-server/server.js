// A Bun.serve app that owns its database for its whole life.
//
//   APP_DB=app.db PORT=3000 bun server.js
//
// A second instance on the same database exits 75 naming the first.
const sidelease = require(process.env.SIDELEASE_MODULE || 'sidelease');

const db = process.env.APP_DB || 'app.db';
let lease;
try {
  lease = sidelease.acquire(db, { metadata: { app: 'bun-server' } });
} catch (e) {
  if (e.code === 'SIDELEASE_IN_USE') {
    console.error(`refusing to start: ${e.message}`);
    process.exit(75);
  }
  throw e;
}

const server = Bun.serve({
  hostname: '127.0.0.1',
  port: Number(process.env.PORT || 0),
  fetch() {
    return Response.json({
      pid: process.pid,
      generation: lease.generation,
      previousReleasedCleanly: lease.previousReleasedCleanly,
      lease: lease.check(),
    });
  },
});
console.log(`listening on ${server.port}`);

for (const sig of ['SIGINT', 'SIGTERM']) {
  process.on(sig, () => {
    server.stop(true);
    lease.release();
    process.exit(0);
  });
}
