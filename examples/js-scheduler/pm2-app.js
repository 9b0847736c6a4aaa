// One PM2 instance: it campaigns for APP_DB and, while it leads, runs the
// node-cron job (scheduler.js). PM2 stops an instance with SIGINT, then
// SIGKILL after kill_timeout: stopping the elector ends the job and lets
// the lease go at once, so another instance leads without waiting out a
// timeout.
const { schedule } = require('./scheduler.js');

const elector = schedule(process.env.APP_DB);
process.on('SIGINT', async () => {
  await elector.stop();
  process.exit(0); // cluster mode's channel to PM2 would keep it alive
});
