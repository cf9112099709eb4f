// NIP-34 events built and signed by nostr-tools with real keys, in the forms
// ngit and other clients publish them.
import { finalizeEvent, generateSecretKey, getPublicKey } from 'nostr-tools/pure';
import { npubEncode } from 'nostr-tools/nip19';
import { randomBytes } from 'node:crypto';

/** Key is a fresh secret key and its hex public key. */
export function newKey() {
  const sk = generateSecretKey();
  return { sk, pk: getPublicKey(sk) };
}

const now = () => Math.floor(Date.now() / 1000);

function sign(key, kind, tags, content = '', createdAt = now()) {
  return finalizeEvent({ kind, tags, content, created_at: createdAt }, key.sk);
}

/** repoRef is the coordinate of key's repository d. */
export const repoRef = (pk, d) => `30617:${pk}:${d}`;

/** cloneURL is the GRASP clone URL of key's repository d on a ws(s) service. */
export function cloneURL(serviceURL, pk, d) {
  const u = new URL(serviceURL);
  u.protocol = u.protocol === 'wss:' ? 'https:' : 'http:';
  return `${u.origin}/${npubEncode(pk)}/${d}.git`;
}

/** fakeCommit is a random 40-hex commit id. */
export const fakeCommit = () => randomBytes(20).toString('hex');

/** announcement is a kind 30617 listing the given clone and relays URLs. */
export function announcement(key, d, { clone = [], relays = [], maintainers = [] } = {}) {
  const tags = [['d', d], ['name', d], ['description', `interop repository ${d}`]];
  if (clone.length) tags.push(['clone', ...clone]);
  if (relays.length) tags.push(['relays', ...relays]);
  tags.push(['r', fakeCommit(), 'euc']);
  if (maintainers.length) tags.push(['maintainers', ...maintainers]);
  return sign(key, 30617, tags);
}

/** served is an announcement listing the service in both clone and relays. */
export function served(key, d, serviceURL, maintainers = []) {
  return announcement(key, d, { clone: [cloneURL(serviceURL, key.pk, d)], relays: [serviceURL], maintainers });
}

/** state is a kind 30618 with a main branch at a fresh commit. */
export function state(key, d) {
  return sign(key, 30618, [['d', d], ['refs/heads/main', fakeCommit()], ['HEAD', 'ref: refs/heads/main']]);
}

/** patch is a kind 1617 against repo (a coordinate). */
export function patch(key, repo) {
  const commit = fakeCommit();
  const content = `From ${commit} Mon Sep 17 00:00:00 2001
From: interop <interop@example.invalid>
Date: Mon, 1 Jan 2024 00:00:00 +0000
Subject: [PATCH] interop change

---
 README.md | 1 +
 1 file changed, 1 insertion(+)

diff --git a/README.md b/README.md
--- a/README.md
+++ b/README.md
@@ -1 +1,2 @@
 hello
+interop
`;
  return sign(key, 1617, [['a', repo], ['p', repo.split(':')[1]], ['commit', commit], ['t', 'root']], content);
}

/** issue is a kind 1621 on repo, plus extra tags. */
export function issue(key, repo, subject, extra = [], createdAt) {
  return sign(key, 1621, [['a', repo], ['p', repo.split(':')[1]], ['subject', subject], ...extra], `${subject}\n\nfiled by the interop suite`, createdAt);
}

/** comment is a NIP-22 kind 1111 replying to root (and parent, default root). */
export function comment(key, root, text, parent = root) {
  return sign(key, 1111, [
    ['E', root.id, '', root.pubkey], ['K', String(root.kind)], ['P', root.pubkey],
    ['e', parent.id, '', parent.pubkey], ['k', String(parent.kind)], ['p', parent.pubkey],
  ], text);
}

/** repoComment is a NIP-22 kind 1111 on the repository itself (A = repo). */
export function repoComment(key, repo, text) {
  const owner = repo.split(':')[1];
  return sign(key, 1111, [['A', repo, ''], ['K', '30617'], ['P', owner], ['a', repo, ''], ['k', '30617'], ['p', owner]], text);
}

/** status is a kind 1630–1633 on root. */
export function status(key, kind, root) {
  const tags = [['e', root.id, '', 'root'], ['p', root.pubkey]];
  for (const t of root.tags) if (t[0] === 'a') tags.push(['a', t[1]]);
  return sign(key, kind, tags, '');
}

/** note is a kind 1 with the given tags. */
export const note = (key, text, tags = []) => sign(key, 1, tags, text);

/** deletion is a NIP-09 kind 5 naming the events' ids (and coordinates of addressable ones). */
export function deletion(key, events) {
  const tags = [];
  for (const e of events) {
    tags.push(['e', e.id]);
    if (e.kind >= 30000 && e.kind < 40000) {
      const d = e.tags.find((t) => t[0] === 'd')?.[1] ?? '';
      tags.push(['a', `${e.kind}:${e.pubkey}:${d}`]);
    }
  }
  return sign(key, 5, tags, 'interop deletion');
}
