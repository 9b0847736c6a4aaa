// The part both servers share: campaign for APP_DB and, while this process
// leads, run the node-cron job (one line per tick appended to APP_TICKS).
const fs = require('node:fs');
const cron = require('node-cron');
const sidelease = require(process.env.SIDELEASE_MODULE || 'sidelease');

function tick() {
  fs.appendFileSync(process.env.APP_TICKS, `${process.pid} ${Date.now()}\n`); // O_APPEND
}

/** Start campaigning; the returned elector's stop() ends it. */
function schedule(db) {
  const elector = new sidelease.Elector(db, { metadata: { app: 'scheduler' } });
  elector.on('elected', ({ signal }) => {
    const task = cron.schedule('* * * * * *', tick); // every second
    signal.addEventListener('abort', () => task.destroy(), { once: true });
  });
  elector.start();
  return elector;
}

module.exports = { schedule };
