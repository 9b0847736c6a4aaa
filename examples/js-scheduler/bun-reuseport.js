// One of several Bun.serve processes sharing a port (reusePort); the
// node-cron job runs in the elected one only. Start as many as you like:
//
//   APP_DB=app.db APP_TICKS=ticks.log PORT=3000 bun bun-reuseport.js
const { schedule } = require('./scheduler.js');

const elector = schedule(process.env.APP_DB);
const server = Bun.serve({
  hostname: '127.0.0.1',
  port: Number(process.env.PORT),
  reusePort: true,
  fetch: () => Response.json({ pid: process.pid, ...elector.snapshot }),
});
console.log(`listening on ${server.port}`);
process.on('SIGTERM', async () => {
  server.stop();
  await elector.stop(); // the job stops and the lease is released
  process.exit(0);
});
