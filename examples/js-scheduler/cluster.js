// node:cluster with 4 workers serving one port; the node-cron job runs in
// the elected worker only. A worker that dies is replaced, and the
// replacement campaigns as a follower.
//
//   APP_DB=app.db APP_TICKS=ticks.log PORT=3000 node cluster.js
const cluster = require('node:cluster');
const http = require('node:http');

if (cluster.isPrimary) {
  const workers = Number(process.env.WORKERS || 4);
  for (let i = 0; i < workers; i++) cluster.fork();
  let stopping = false;
  cluster.on('exit', () => {
    if (!stopping) cluster.fork();
  });
  process.on('SIGTERM', () => {
    stopping = true;
    for (const w of Object.values(cluster.workers)) w.process.kill('SIGTERM');
  });
} else {
  const { schedule } = require('./scheduler.js');
  const elector = schedule(process.env.APP_DB);
  const server = http
    .createServer((req, res) => {
      res.setHeader('content-type', 'application/json');
      res.end(JSON.stringify({ pid: process.pid, ...elector.snapshot }));
    })
    .listen(Number(process.env.PORT || 0), '127.0.0.1', () => process.send({ listening: server.address().port }));
  process.on('SIGTERM', async () => {
    server.close();
    await elector.stop(); // the job stops and the lease is released
    process.exit(0); // the channel to the primary would keep this worker alive
  });
}
