// A minimal case runner: each case runs under a timeout, prints
// `PASS name` or `FAIL name: reason`, and is counted. Resources a case opens
// are registered with ctx.defer and released when the case ends, also when
// it timed out (the timed-out promise is abandoned, its sockets closed).

/** CaseError is a failure whose message is the whole reason (no stack). */
export class CaseError extends Error {}

/** fail throws a CaseError with the given reason. */
export function fail(reason) {
  throw new CaseError(reason);
}

/** check fails with reason unless cond holds. */
export function check(cond, reason) {
  if (!cond) fail(typeof reason === 'function' ? reason() : reason);
}

export class Suite {
  constructor({ prefix = '', defaultTimeoutMs = 60_000 } = {}) {
    this.prefix = prefix;
    // guard, when set, returns why no case can run now (graspd died), so
    // the remaining cases fail at once instead of each waiting out its timeout.
    this.guard = null;
    this.defaultTimeoutMs = defaultTimeoutMs;
    this.passed = 0;
    this.failed = 0;
    this.failures = [];
  }

  /**
   * run executes one case. fn(ctx) may return a value, which run returns
   * (undefined when the case failed), so later cases can depend on it.
   * ctx.defer(fn) registers a cleanup.
   */
  async run(name, fn, { timeoutMs = this.defaultTimeoutMs } = {}) {
    const full = this.prefix + name;
    const cleanups = [];
    const ctx = { defer: (f) => cleanups.push(f), name: full };
    let timer;
    const timeout = new Promise((_, reject) => {
      timer = setTimeout(() => reject(new CaseError(`timed out after ${timeoutMs} ms`)), timeoutMs);
    });
    let result;
    try {
      const why = this.guard?.();
      if (why) throw new CaseError(`not run: ${why}`);
      result = await Promise.race([Promise.resolve().then(() => fn(ctx)), timeout]);
      this.passed++;
      console.log(`PASS ${full}`);
    } catch (err) {
      result = undefined;
      this.failed++;
      const reason = err instanceof CaseError ? err.message : (err?.stack ?? String(err));
      this.failures.push({ name, reason });
      console.log(`FAIL ${full}: ${oneLine(reason)}`);
    } finally {
      clearTimeout(timer);
      for (const f of cleanups.reverse()) {
        try { await Promise.race([Promise.resolve().then(f), new Promise((r) => setTimeout(r, 5_000))]); } catch { /* best effort */ }
      }
    }
    return result;
  }

  /** skip counts a case that could not run because one it needs failed. */
  skipFailed(name, because) {
    this.failed++;
    this.failures.push({ name, reason: because });
    console.log(`FAIL ${this.prefix}${name}: not run: ${because}`);
  }
}

function oneLine(s) {
  return String(s).replace(/\s*\n\s*/g, ' | ');
}
