#!/usr/bin/env node
// The interop suite: graspd driven by nostr clients we did not write
// (nostr-tools, the rust-nostr SDK). Each run starts a fresh graspd (the
// built binary, embedded NATS, every service, a temporary data directory,
// free loopback ports), runs every case against it and stops it.
//
// Every case prints `PASS name` or `FAIL name: reason`; the last line is
// `N passed, M failed`, and the exit status is non-zero when M > 0.
//
// Environment:
//   GRASPD             the graspd binary (default ../bin/graspd)
//   INTEROP_RUNS       how many runs in a row (default 1), each on a fresh graspd
//   INTEROP_SYNC_EVENTS  events the SDK syncs down (default 600)
//   INTEROP_ONLY       run only the groups named (comma-separated: burst,nip11,publish,policy,sdk)
//   INTEROP_KEEP       keep graspd's data directory and log after a failed run
import { resolve, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { existsSync } from 'node:fs';
import { startGraspd } from './lib/graspd.mjs';
import { Suite } from './lib/harness.mjs';
import * as tools from './cases/nostr-tools.mjs';
import * as rust from './cases/rust-nostr.mjs';

const here = dirname(fileURLToPath(import.meta.url));
const binary = resolve(here, process.env.GRASPD ?? '../bin/graspd');
const runs = positiveInt('INTEROP_RUNS', 1);
const syncEvents = positiveInt('INTEROP_SYNC_EVENTS', 600);
const only = new Set((process.env.INTEROP_ONLY ?? 'burst,nip11,publish,policy,sdk').split(',').map((s) => s.trim()));
// A run that exceeds this is stopped: the per-case timeouts should end it
// long before, this is the bound on everything else (start, stop).
const RUN_LIMIT_MS = 10 * 60_000;

function positiveInt(name, def) {
  const v = process.env[name];
  if (v === undefined || v === '') return def;
  const n = Number(v);
  if (!Number.isInteger(n) || n < 1) {
    console.log(`interop: ${name}=${v}: want a positive integer`);
    process.exit(2);
  }
  return n;
}

if (!existsSync(binary)) {
  console.log(`interop: ${binary} not found; run \`make build\` (or set GRASPD)`);
  console.log('0 passed, 1 failed');
  process.exit(1);
}

let passed = 0;
let failed = 0;
const failuresByCase = new Map();

for (let run = 1; run <= runs; run++) {
  const suite = new Suite({ prefix: runs > 1 ? `run ${run}/${runs}: ` : '' });
  const limit = setTimeout(() => {
    console.log(`FAIL ${suite.prefix}run limit: still running after ${RUN_LIMIT_MS} ms`);
    console.log(`${passed + suite.passed} passed, ${failed + suite.failed + 1} failed`);
    process.exit(1); // the exit handler kills graspd
  }, RUN_LIMIT_MS);
  limit.unref();

  const g = await suite.run('graspd starts and is ready', () => startGraspd({ binary }), { timeoutMs: 90_000 });
  if (g) {
    console.log(`interop: graspd pid ${g.pid} at ${g.relayURL}, log ${g.logPath}`);
    suite.guard = () => (g.alive() ? null : 'graspd exited');
    try {
      // First: the burst is sensitive to a freshly started graspd.
      if (only.has('burst')) await tools.burst(suite, g);
      if (only.has('nip11')) await tools.nip11(suite, g);
      if (only.has('publish')) await tools.publishAndQuery(suite, g);
      if (only.has('policy')) await tools.policy(suite, g);
      if (only.has('sdk')) await rust.sync(suite, g, { count: syncEvents });
      await suite.run('graspd still running after the cases', async () => {
        const res = await fetch(g.httpURL, { headers: { Accept: 'application/nostr+json' }, signal: AbortSignal.timeout(10_000) });
        await res.arrayBuffer();
        if (res.status !== 200 || !g.alive()) throw new Error(`graspd answers NIP-11 with ${res.status}, alive=${g.alive()}`);
      });
    } finally {
      const keep = suite.failed > 0 && process.env.INTEROP_KEEP === '1';
      if (suite.failed > 0) console.log(`interop: graspd log (last lines):\n${indent(g.log(20))}`);
      await g.stop({ keep });
      if (keep) console.log(`interop: kept ${g.dataDir}`);
    }
  }
  clearTimeout(limit);
  passed += suite.passed;
  failed += suite.failed;
  for (const f of suite.failures) failuresByCase.set(f.name, (failuresByCase.get(f.name) ?? 0) + 1);
}

if (runs > 1 && failuresByCase.size > 0) {
  console.log(`interop: failures over ${runs} runs:`);
  for (const [name, count] of failuresByCase) console.log(`  ${count}/${runs} ${name}`);
}
console.log(`${passed} passed, ${failed} failed`);
// The SDK's WASM runtime keeps timers of its own; do not wait for them.
process.exit(failed > 0 ? 1 : 0);

function indent(s) {
  return s.split('\n').map((l) => `  ${l}`).join('\n');
}
