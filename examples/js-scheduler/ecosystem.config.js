// PM2: four instances of the scheduler in cluster mode; sidelease elects
// the one that runs the cron job, and PM2 restarts any that dies.
//
//   APP_DB=app.db APP_TICKS=ticks.log pm2-runtime ecosystem.config.js
//
// The instances inherit this environment (APP_DB, APP_TICKS).
module.exports = {
  apps: [
    {
      name: 'scheduler',
      script: `${__dirname}/pm2-app.js`,
      exec_mode: 'cluster',
      instances: 4,
      kill_timeout: 5000, // SIGINT first; SIGKILL only after 5 s
    },
  ],
};
