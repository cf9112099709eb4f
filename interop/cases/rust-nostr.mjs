// Cases driven by the rust-nostr SDK (npm @rust-nostr/nostr-sdk, the SDK
// ngit is built on): NIP-77 sync from our relay and to it. The SDK's sync
// down reconciles, then fetches the ids it lacks by REQ in chunks of 100,
// reusing one subscription id (REQ x … EOSE, CLOSE x, REQ x …): every chunk
// must come back complete.
//
// The SDK's default database keeps no events, so each client gets the SDK's
// IndexedDB database, on fake-indexeddb (an in-memory IndexedDB for Node).
import 'fake-indexeddb/auto';
import sdk from '@rust-nostr/nostr-sdk';
import { check, fail } from '../lib/harness.mjs';
import { connect, publish, query, ids } from '../lib/client.mjs';
import * as n from '../lib/nip34.mjs';

const {
  loadWasmAsync, Keys, ClientBuilder, NostrDatabase, NostrSigner, EventBuilder, Kind, Tag, Filter,
  SyncOptions, SyncDirection, Duration, Timestamp,
} = sdk;

let loaded;
const ready = () => (loaded ??= loadWasmAsync());

let dbSeq = 0;

/** sdkClient builds a client with its own empty IndexedDB database, connected to url. */
async function sdkClient(url, keys, ctx) {
  await ready();
  const db = await NostrDatabase.indexeddb(`interop-${process.pid}-${++dbSeq}`);
  const client = new ClientBuilder().signer(NostrSigner.keys(keys)).database(db).build();
  ctx.defer(() => client.shutdown());
  await client.addRelay(url);
  await client.connect();
  await client.waitForConnection(Duration.fromSecs(10));
  return client;
}

const hex = (eventIds) => new Set(eventIds.map((id) => id.toHex()));

function syncOpts(direction) {
  return new SyncOptions().direction(direction).initialTimeout(Duration.fromSecs(30));
}

/** syncResult checks the output names our relay as a success and returns its report. */
function syncResult(out, url) {
  const failed = out.failed.map((f) => `${f.url}: ${f.error}`);
  check(failed.length === 0, `sync failed on ${failed.join('; ')}`);
  check(out.success.some((u) => sameRelay(u, url)), `sync succeeded on ${JSON.stringify(out.success)}, not ${url}`);
  return out.report;
}

const sameRelay = (a, b) => a.replace(/\/$/, '') === b.replace(/\/$/, '');

/** missing lists the ids of want absent from got. */
const missing = (want, got) => [...want].filter((id) => !got.has(id));

/**
 * sync seeds `count` issues on a served repository through nostr-tools, then
 * has the SDK sync them down (reconciliation, then the id fetch) and up.
 */
export async function sync(suite, g, { count = 600, up = 150 } = {}) {
  await ready();
  const owner = n.newKey();
  const d = `sdk-${Date.now().toString(36)}`;
  const repo = n.repoRef(owner.pk, d);
  const filterJSON = JSON.stringify({ kinds: [1621], '#a': [repo] });

  // Setup: the repository and `count` issues on our relay. The announcement
  // is acknowledged before any issue is sent; the issues, which depend only
  // on it, go out in windows of 50 unacknowledged EVENTs.
  const seeded = await suite.run(`rust-nostr setup: ${count} issues published on graspd`, async (ctx) => {
    const w = await connect(g.relayURL, ctx);
    const a = await publish(w, n.served(owner, d, g.relayURL));
    check(a.ok, `announcement refused: ${a.msg}`);
    const base = Math.floor(Date.now() / 1000) - count;
    const issues = Array.from({ length: count }, (_, i) => n.issue(owner, repo, `issue ${i}`, [], base + i));
    for (let i = 0; i < issues.length; i += 50) {
      const rs = await Promise.all(issues.slice(i, i + 50).map((e) => publish(w, e)));
      const refused = rs.filter((r) => !r.ok);
      check(refused.length === 0, `${refused.length} issues refused, first: ${refused[0]?.msg}`);
    }
    return new Set(issues.map((e) => e.id));
  });
  const names = {
    down: `rust-nostr NIP-77 sync down: learns the ${count} ids it lacks`,
    fetch: `rust-nostr id fetch after sync: every chunk of 100 complete (${count}/${count})`,
    up: `rust-nostr NIP-77 sync up: graspd gets the ${up} events it lacked`,
  };
  if (!seeded) {
    for (const name of Object.values(names)) suite.skipFailed(name, 'setup failed');
    return;
  }

  // One SDK client with an empty database syncs down: the reconciliation
  // is one case, the id fetch that follows another.
  let report;
  let received;
  const learned = await suite.run(names.down, async (ctx) => {
    const keys = Keys.generate();
    const client = await sdkClient(g.relayURL, keys, ctx);
    const out = await client.sync(Filter.fromJson(filterJSON), syncOpts(SyncDirection.Down));
    report = syncResult(out, g.relayURL);
    const remote = hex(report.remote);
    const lack = missing(seeded, remote);
    check(lack.length === 0, `reconciliation named ${remote.size} ids; ${lack.length} of ${count} missing`);
    check(remote.size === count, `reconciliation named ${remote.size} ids, want ${count}`);
    check(report.local.length === 0, `reconciliation says the empty client has ${report.local.length} events the relay lacks`);
    const stored = await client.database.query(Filter.fromJson(filterJSON));
    received = { report: hex(report.received), db: new Set(stored.toVec().map((e) => e.id.toHex())) };
    return true;
  }, { timeoutMs: 120_000 });

  await suite.run(names.fetch, async () => {
    if (!learned) fail('the sync down did not complete');
    const lackReport = missing(seeded, received.report);
    const lackDB = missing(seeded, received.db);
    check(lackReport.length === 0 && lackDB.length === 0,
      `the SDK received ${count - lackReport.length}/${count} and stored ${count - lackDB.length}/${count} ` +
      `after a sync it reports as a success (${Math.ceil(lackDB.length / 100)} chunk(s) of 100 short)`);
  });

  // Sync up: a client holding `up` events the relay lacks and 50 it has.
  await suite.run(names.up, async (ctx) => {
    const keys = Keys.generate();
    const client = await sdkClient(g.relayURL, keys, ctx);
    const base = Math.floor(Date.now() / 1000) - up;
    const fresh = [];
    for (let i = 0; i < up; i++) {
      // Built and signed by the SDK itself.
      const e = new EventBuilder(new Kind(1621), `sdk issue ${i}\n\nsynced up by the interop suite`)
        .tags([Tag.parse(['a', repo]), Tag.parse(['p', owner.pk]), Tag.parse(['subject', `sdk issue ${i}`])])
        .customCreatedAt(Timestamp.fromSecs(base + i))
        .signWithKeys(keys);
      fresh.push(e);
    }
    for (const e of fresh) await client.database.save_event(e);
    // 50 the relay already has, fetched from it so the SDK holds the same events.
    const reader = await connect(g.relayURL, ctx);
    const shared = await query(reader, { ids: [...seeded].slice(0, 50) });
    check(shared.length === 50, `relay served ${shared.length}/50 seeded events by id`);
    for (const e of shared) await client.database.save_event(sdk.Event.fromJson(JSON.stringify(e)));
    const freshIDs = new Set(fresh.map((e) => e.id.toHex()));
    check(Number(await client.database.count(Filter.fromJson(filterJSON))) === up + 50, 'the SDK database does not hold the events');

    const out = await client.sync(Filter.fromJson(filterJSON), syncOpts(SyncDirection.Up));
    const rep = syncResult(out, g.relayURL);
    const local = hex(rep.local);
    check(missing(freshIDs, local).length === 0 && local.size === up,
      `reconciliation found ${local.size} events the relay lacks, want the ${up} fresh ones`);
    const sent = hex(rep.sent);
    check(missing(freshIDs, sent).length === 0, `the SDK sent ${sent.size}/${up} (failures are in the SDK's report)`);
    const served = ids(await query(reader, { ids: [...freshIDs] }));
    const lack = missing(freshIDs, served);
    check(lack.length === 0, `graspd serves ${up - lack.length}/${up} of the synced events`);
  }, { timeoutMs: 120_000 });
}
