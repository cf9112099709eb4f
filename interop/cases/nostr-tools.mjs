// Cases driven by nostr-tools: the NIP-11 document, publishing and querying
// the NIP-34 kinds a git client uses, and the write policy's acceptance
// cases over a websocket (pkg/policy; the same cases services/relay's
// TestAcceptanceCasesOverWebsocket runs with go-nostr).
import { fetchRelayInformation } from 'nostr-tools/nip11';
import { verifyEvent } from 'nostr-tools/pure';
import { check, fail } from '../lib/harness.mjs';
import { connect, publish, query, ids } from '../lib/client.mjs';
import * as n from '../lib/nip34.mjs';

/** nip11 checks the relay information document nostr-tools reads. */
export async function nip11(suite, g) {
  await suite.run('nostr-tools NIP-11 document', async () => {
    const info = await fetchRelayInformation(g.relayURL);
    for (const nip of [1, 9, 11, 34, 77]) {
      check(info.supported_nips?.includes(nip), `supported_nips ${JSON.stringify(info.supported_nips)} lacks ${nip}`);
    }
    check(typeof info.name === 'string' && info.name !== '', `name ${JSON.stringify(info.name)}`);
    check(info.limitation?.max_limit > 0, `limitation.max_limit ${info.limitation?.max_limit}`);
    check(info.limitation?.restricted_writes === true, 'limitation.restricted_writes is not true');
    check(JSON.stringify(info.supported_grasps) === '["GRASP-01","GRASP-02"]', `supported_grasps ${JSON.stringify(info.supported_grasps)}`);
  });
}

/**
 * publishAndQuery publishes an announcement listing the relay, its state, a
 * patch, an issue, a comment and a status, each answered OK true, then reads
 * them back from another connection by the filters clients use.
 */
export async function publishAndQuery(suite, g) {
  const owner = n.newKey();
  const contributor = n.newKey();
  const d = `interop-${Date.now().toString(36)}`;
  const repo = n.repoRef(owner.pk, d);
  const ann = n.served(owner, d, g.relayURL);
  const st = n.state(owner, d);
  const pt = n.patch(contributor, repo);
  const is = n.issue(contributor, repo, 'interop issue');
  const cm = n.comment(owner, is, 'thanks, looking into it');
  const stat = n.status(owner, 1632, is);
  const steps = [
    [`announcement listing ${g.relayURL}`, ann],
    ['state', st], ['patch', pt], ['issue', is], ['comment', cm], ['status (closed)', stat],
  ];
  const writer = { relay: null };
  let published = 0;
  for (const [what, evt] of steps) {
    const ok = await suite.run(`nostr-tools publish ${what}: OK true`, async (ctx) => {
      writer.relay ??= await connect(g.relayURL);
      const r = await publish(writer.relay, evt);
      check(r.ok, `OK false: ${r.msg}`);
      return true;
    });
    if (ok) published++;
  }
  writer.relay?.close();
  const all = steps.map(([, e]) => e);
  const byID = new Map(all.map((e) => [e.id, e]));

  const queries = [
    ['all six by ids', { ids: all.map((e) => e.id) }, all],
    ['announcement by kind, author and #d', { kinds: [30617], authors: [owner.pk], '#d': [d] }, [ann]],
    ['state by kind, author and #d', { kinds: [30618], authors: [owner.pk], '#d': [d] }, [st]],
    ['patch and issue by #a repo', { kinds: [1617, 1621], '#a': [repo] }, [pt, is]],
    ['comment by #E issue', { kinds: [1111], '#E': [is.id] }, [cm]],
    ['status by #e issue', { kinds: [1630, 1631, 1632, 1633], '#e': [is.id] }, [stat]],
  ];
  for (const [what, filter, want] of queries) {
    if (published !== steps.length) {
      suite.skipFailed(`nostr-tools query ${what}`, 'a publish failed');
      continue;
    }
    await suite.run(`nostr-tools query ${what}`, async (ctx) => {
      const reader = await connect(g.relayURL, ctx);
      const got = await query(reader, filter);
      const gotIDs = ids(got);
      const missing = want.filter((e) => !gotIDs.has(e.id));
      check(missing.length === 0, () => `missing kinds ${missing.map((e) => e.kind)} of ${want.length}; got ${got.length} events`);
      check(got.length === want.length, `got ${got.length} events, want ${want.length}`);
      for (const e of got) {
        const sent = byID.get(e.id);
        check(verifyEvent(e), `event ${e.id} does not verify`);
        check(JSON.stringify(e.tags) === JSON.stringify(sent.tags) && e.content === sent.content && e.sig === sent.sig,
          `event ${e.id} changed in the store`);
      }
    });
  }

  await suite.run('nostr-tools live subscription gets an issue published after EOSE', async (ctx) => {
    if (published !== steps.length) fail('a publish failed');
    const sub = await connect(g.relayURL, ctx);
    const pub = await connect(g.relayURL, ctx);
    const late = n.issue(contributor, repo, 'late issue');
    const arrived = new Promise((resolve, reject) => {
      const s = sub.subscribe([{ kinds: [1621], '#a': [repo], since: late.created_at - 60 }], {
        onevent: (e) => { if (e.id === late.id) resolve(e); },
        oneose: async () => {
          try {
            const r = await publish(pub, late);
            if (!r.ok) reject(new Error(`late issue OK false: ${r.msg}`));
          } catch (err) { reject(err); }
        },
        onclose: (reason) => reject(new Error(`subscription closed: ${reason}`)),
      });
      ctx.defer(() => s.close());
    });
    const e = await arrived;
    check(e.sig === late.sig, 'live event differs from the published one');
  });
}

/**
 * policy runs the write policy's acceptance cases. Each case starts from a
 * fresh served repository ("repo", owned by alice); a step's OK must be true
 * or false with the expected prefix, and a second connection must then find
 * the event stored exactly when it was accepted (a deletion: its target gone).
 */
export async function policy(suite, g) {
  const host = new URL(g.relayURL).hostname;
  // Loopback literals on another port: "elsewhere" for the policy, and
  // nothing the fetcher dials (internal addresses are not allowlisted).
  const elseClone = 'http://127.0.0.1:1/someone/repo.git';
  const elseRelays = 'ws://127.0.0.1:1';
  const evil = `${host}.evil.net`;
  const ACCEPTED = 'accepted';
  const BLOCKED = 'blocked: ';
  const INVALID = 'invalid: ';
  const srv = (k, d, maint = []) => n.served(k, d, g.relayURL, maint);
  const ann = (k, d, clone, relays, maint = []) => n.announcement(k, d, { clone: [clone], relays: [relays], maintainers: maint });
  const cases = [
    ['01 announcement listing us', (a, b) => [['bob\'s served repo', srv(b, 'other'), ACCEPTED]]],
    ['02 clone elsewhere, relays us', (a, b, c, m) => [['refused', ann(m, 'x', elseClone, g.relayURL), BLOCKED]]],
    ['03 clone us, relays elsewhere', (a, b, c, m) => [['refused', ann(m, 'x', n.cloneURL(g.relayURL, m.pk, 'x'), elseRelays), BLOCKED]]],
    ['04 recursive maintainer listing elsewhere', (a, b, c, m) => [
      ['owner names bob', srv(a, 'team', [b.pk]), ACCEPTED],
      ['bob names carol', ann(b, 'team', elseClone, elseRelays, [a.pk, c.pk]), ACCEPTED],
      ['carol', ann(c, 'team', elseClone, elseRelays), ACCEPTED],
      ['mallory', ann(m, 'team', elseClone, elseRelays, [a.pk]), BLOCKED],
    ]],
    ['05 issue with a = served repo', (a, b, c, m) => [['issue', n.issue(m, n.repoRef(a.pk, 'repo'), 'bug'), ACCEPTED]]],
    ['06 comment with A = served repo', (a, b, c, m) => [['comment', n.repoComment(m, n.repoRef(a.pk, 'repo'), 'hi'), ACCEPTED]]],
    ['07 kind 1 with q = served repo', (a, b, c, m) => [['note', n.note(m, 'look', [['q', n.repoRef(a.pk, 'repo')]]), ACCEPTED]]],
    ['08 issue on unknown repo quoting an accepted issue', (a, b, c, m) => {
      const root = n.issue(a, n.repoRef(a.pk, 'repo'), 'root');
      return [['accepted issue', root, ACCEPTED], ['issue', n.issue(m, n.repoRef(m.pk, 'unknown'), 'dup', [['q', root.id]]), ACCEPTED]];
    }],
    ['09 comment on accepted issue', (a, b, c, m) => {
      const root = n.issue(a, n.repoRef(a.pk, 'repo'), 'root');
      return [['issue', root, ACCEPTED], ['comment', n.comment(m, root, 'me too'), ACCEPTED]];
    }],
    ['10 kind 1 replying to accepted kind 1', (a, b, c, m) => {
      const about = n.note(a, 'about', [['q', n.repoRef(a.pk, 'repo')]]);
      return [['note', about, ACCEPTED], ['reply', n.note(m, 'reply', [['e', about.id, '', 'root']]), ACCEPTED]];
    }],
    ['11 forward reference', (a, b, c, m) => {
      const untagged = n.note(m, 'untagged');
      return [['issue quoting the note', n.issue(a, n.repoRef(a.pk, 'repo'), 'see', [['q', untagged.id]]), ACCEPTED], ['the note', untagged, ACCEPTED]];
    }],
    ['12 chains by forward reference', (a, b) => {
      const n1 = n.note(b, 'n1');
      const n2 = n.note(b, 'n2', [['e', n1.id]]);
      const n3 = n.note(b, 'n3', [['q', n.repoRef(a.pk, 'repo')], ['e', n2.id]]);
      return [['n1 orphan', n1, BLOCKED], ['n3 anchored', n3, ACCEPTED], ['n2 via n3', n2, ACCEPTED], ['n1 via n2', n1, ACCEPTED]];
    }],
    ['13 issue on unknown repo only', (a, b, c, m) => [['issue', n.issue(m, n.repoRef(m.pk, 'unknown'), 'bug'), BLOCKED]]],
    ['14 kind 1 without tags', (a, b, c, m) => [['note', n.note(m, 'spam'), BLOCKED]]],
    ['15 comment with A = unknown repo', (a, b, c, m) => [['comment', n.repoComment(m, n.repoRef(m.pk, 'unknown'), 'hi'), BLOCKED]]],
    ['16 state by owner or recursive maintainer only', (a, b, c, m) => [
      ['owner names bob', srv(a, 'team', [b.pk]), ACCEPTED],
      ['bob names carol', ann(b, 'team', elseClone, elseRelays, [c.pk]), ACCEPTED],
      ['owner\'s state', n.state(a, 'team'), ACCEPTED],
      ['carol\'s state', n.state(c, 'team'), ACCEPTED],
      ['mallory\'s state', n.state(m, 'team'), BLOCKED],
    ]],
    ['17 deletions', (a, b, c, m) => {
      const target = n.issue(a, n.repoRef(a.pk, 'repo'), 'bug');
      const mine = n.note(m, 'mine', [['e', target.id]]);
      return [
        ['issue', target, ACCEPTED],
        ['mallory\'s note', mine, ACCEPTED],
        ['mallory deletes alice\'s issue', n.deletion(m, [target]), BLOCKED, { gone: [] }],
        ['mallory deletes her note', n.deletion(m, [mine]), ACCEPTED, { gone: [mine] }],
        ['deleted note re-sent', mine, BLOCKED],
        ['issue re-sent (duplicate is OK true)', target, ACCEPTED],
      ];
    }],
    ['18 host confusion', (a, b, c, m) => [
      [`clone and relays on ${evil}`, ann(m, 'x', `https://${evil}/npub1x/x.git`, `wss://${evil}`), BLOCKED],
      ['clone only', ann(m, 'x', `https://${evil}/npub1x/x.git`, g.relayURL), BLOCKED],
    ]],
    ['19 forged signature', (a, b, c, m) => {
      const forged = { ...n.issue(m, n.repoRef(a.pk, 'repo'), 'forged') };
      forged.sig = n.issue(a, n.repoRef(a.pk, 'repo'), 'other').sig;
      return [['forged', forged, INVALID]];
    }],
    ['20 id not matching the content', (a, b, c, m) => {
      const wrong = { ...n.issue(m, n.repoRef(a.pk, 'repo'), 'wrong id') };
      wrong.content = 'changed after signing';
      return [['wrong id', wrong, INVALID]];
    }],
  ];

  for (const [name, steps] of cases) {
    await suite.run(`nostr-tools policy ${name}`, async (ctx) => {
      const writer = await connect(g.relayURL, ctx);
      const reader = await connect(g.relayURL, ctx);
      const [alice, bob, carol, mallory] = [n.newKey(), n.newKey(), n.newKey(), n.newKey()];
      const base = await publish(writer, srv(alice, 'repo'));
      check(base.ok, `served repo refused: ${base.msg}`);
      for (const [what, evt, want, opts] of steps(alice, bob, carol, mallory)) {
        const r = await publish(writer, evt);
        if (want === ACCEPTED) {
          check(r.ok, `${what}: OK false "${r.msg}", want OK true`);
        } else {
          check(!r.ok && r.msg.startsWith(want), `${what}: OK ${r.ok} "${r.msg}", want OK false with prefix "${want}"`);
        }
        const stored = ids(await query(reader, { ids: [evt.id] })).has(evt.id);
        if (evt.kind === 5) {
          check(stored === r.ok, `${what}: deletion stored=${stored}, OK ${r.ok}`);
          const goneIDs = (opts?.gone ?? []).map((e) => e.id);
          const still = goneIDs.length ? ids(await query(reader, { ids: goneIDs })) : new Set();
          check(still.size === 0, `${what}: deleted event still served`);
        } else {
          check(stored === (want === ACCEPTED), `${what}: stored=${stored} after OK ${r.ok}`);
        }
      }
      // The refused deletion removed nothing: alice's issue is still served.
      if (name.startsWith('17')) {
        const left = await query(reader, { kinds: [1621], authors: [alice.pk] });
        check(left.length === 1, `alice's issue count ${left.length} after mallory's deletion attempt`);
      }
    });
  }
}

/**
 * burst publishes, on one connection and without waiting for any OK, an
 * announcement listing the relay and then `count` issues tagging it, as a
 * client importing a repository's history does. Each issue is judged after
 * the announcement sent before it on that connection: every OK is true.
 * Run it first, on a freshly started graspd.
 */
export async function burst(suite, g, { count = 500 } = {}) {
  await suite.run(`nostr-tools burst: announcement then ${count} issues tagging it, unacknowledged, all OK true`, async (ctx) => {
    const owner = n.newKey();
    const d = `burst-${Date.now().toString(36)}`;
    const repo = n.repoRef(owner.pk, d);
    const ann = n.served(owner, d, g.relayURL);
    const issues = Array.from({ length: count }, (_, i) => n.issue(owner, repo, `imported issue ${i}`));
    const w = await connect(g.relayURL, ctx);
    // nostr-tools writes the EVENTs in call order on the one websocket.
    const results = await Promise.all([ann, ...issues].map((e) => publish(w, e)));
    check(results[0].ok, `announcement OK false: ${results[0].msg}`);
    const refused = results.slice(1).filter((r) => !r.ok);
    check(refused.length === 0, `${refused.length} of ${count} issues refused, first: "${refused[0]?.msg}"`);
    const reader = await connect(g.relayURL, ctx);
    const stored = await query(reader, { kinds: [1621], '#a': [repo], limit: count });
    check(stored.length === count, `graspd serves ${stored.length}/${count} of the issues`);
  }, { timeoutMs: 120_000 });
}
