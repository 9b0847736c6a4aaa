import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
const sidelease = require('./index.js');

export const { acquire, acquireAsync, inspect, Elector, lead, Lease, SideleaseError, version } = sidelease;
export default sidelease;
