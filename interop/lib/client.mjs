// nostr-tools' Relay, with the two outcomes of a publish kept apart (OK
// true/false with its message, versus no answer at all) and queries that
// end on the relay's EOSE only, never on nostr-tools' own EOSE timeout.
import { Relay, useWebSocketImplementation } from 'nostr-tools/relay';
import WebSocket from 'ws';

// Node 20 has no global WebSocket.
useWebSocketImplementation(WebSocket);

/** NO_ANSWER_MS bounds the wait for one OK or EOSE: a bound, not an expectation. */
const NO_ANSWER_MS = 30_000;

/** connect opens a nostr-tools Relay and registers its close with ctx. */
export async function connect(url, ctx) {
  const relay = await Relay.connect(url, { enablePing: false, enableReconnect: false, timeout: NO_ANSWER_MS });
  relay.publishTimeout = NO_ANSWER_MS;
  relay.baseEoseTimeout = NO_ANSWER_MS * 10;
  ctx?.defer(() => relay.close());
  return relay;
}

/**
 * publish sends evt and returns {ok, msg} from the relay's OK. A publish the
 * relay never answers throws.
 */
export async function publish(relay, evt) {
  try {
    const msg = await relay.publish(evt);
    return { ok: true, msg: msg ?? '' };
  } catch (err) {
    const msg = String(err?.message ?? err);
    if (msg === 'publish timed out' || msg.startsWith('connection closed') || !relay.connected) {
      throw new Error(`no OK for ${evt.id} (kind ${evt.kind}): ${msg}`);
    }
    return { ok: false, msg };
  }
}

/**
 * query runs one subscription until the relay's EOSE and returns the events.
 * A CLOSED from the relay rejects with its reason.
 */
export function query(relay, filters) {
  return new Promise((resolve, reject) => {
    const events = [];
    let done = false;
    const sub = relay.subscribe(Array.isArray(filters) ? filters : [filters], {
      onevent: (e) => events.push(e),
      oneose: () => {
        if (done) return;
        done = true;
        clearTimeout(timer);
        sub.close();
        resolve(events);
      },
      onclose: (reason) => {
        if (done) return;
        done = true;
        clearTimeout(timer);
        reject(new Error(`subscription closed by relay: ${reason}`));
      },
    });
    const timer = setTimeout(() => {
      if (done) return;
      done = true;
      sub.close();
      reject(new Error(`no EOSE within ${NO_ANSWER_MS} ms for ${JSON.stringify(filters).slice(0, 200)}`));
    }, NO_ANSWER_MS);
  });
}

/** ids returns the set of the events' ids. */
export const ids = (events) => new Set(events.map((e) => e.id));
