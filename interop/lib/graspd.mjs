// Starts the built graspd on a temporary data directory and free loopback
// ports (embedded NATS, every service), and stops it again: SIGTERM, then
// SIGKILL if it has not exited. Every started process is also killed when
// this node process exits, however it exits.
import { spawn } from 'node:child_process';
import { mkdtempSync, openSync, closeSync, readFileSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';

const running = new Set();
const dataDirs = new Set();

// Last resort: 'exit' handlers may only do synchronous work, and a SIGKILL
// and a recursive remove are synchronous.
process.on('exit', () => {
  for (const child of running) {
    try { child.kill('SIGKILL'); } catch { /* already gone */ }
  }
  for (const dir of dataDirs) rmSync(dir, { recursive: true, force: true });
});
for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP']) {
  process.on(sig, () => {
    console.log(`interop: ${sig}, stopping graspd`);
    process.exit(130);
  });
}

/** freePort asks the kernel for an unused loopback port. */
async function freePort() {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

/**
 * startGraspd runs `binary` and resolves once its /readyz answers 200 and its
 * relay answers a NIP-11 request. It retries on a fresh set of ports when the
 * process exits during start (a port taken between probe and bind).
 */
export async function startGraspd({ binary, readyTimeoutMs = 60_000, env = {} }) {
  let lastErr;
  for (let attempt = 1; attempt <= 3; attempt++) {
    try {
      return await startOnce({ binary, readyTimeoutMs, env });
    } catch (err) {
      lastErr = err;
      if (!err.exitedEarly) break;
    }
  }
  throw lastErr;
}

async function startOnce({ binary, readyTimeoutMs, env }) {
  const dataDir = mkdtempSync(join(tmpdir(), 'grasp-interop-'));
  dataDirs.add(dataDir);
  const [relayPort, metricsPort, natsPort] = [await freePort(), await freePort(), await freePort()];
  const relayURL = `ws://127.0.0.1:${relayPort}`;
  const logPath = join(dataDir, 'graspd.log');
  const logFd = openSync(logPath, 'a');
  const child = spawn(binary, [], {
    stdio: ['ignore', logFd, logFd],
    env: {
      PATH: process.env.PATH,
      HOME: process.env.HOME ?? dataDir,
      GRASP_DATA_DIR: join(dataDir, 'data'),
      GRASP_RELAY_ADDR: `127.0.0.1:${relayPort}`,
      GRASP_PUBLIC_URL: relayURL,
      GRASP_METRICS_ADDR: `127.0.0.1:${metricsPort}`,
      GRASP_NATS_LISTEN: `127.0.0.1:${natsPort}`,
      // The clients of this suite connect from loopback; say so rather than
      // rely on the default, so the suite's hundreds of events per second
      // are not rate-limited whatever the default becomes.
      GRASP_RELAY_TRUSTED_ADDRESSES: '127.0.0.1,::1',
      GRASP_LOG_LEVEL: 'info',
      ...env,
    },
  });
  closeSync(logFd);
  running.add(child);
  let exited = null;
  const exitedPromise = new Promise((resolve) => {
    child.once('exit', (code, signal) => {
      exited = { code, signal };
      running.delete(child);
      resolve(exited);
    });
  });
  const handle = {
    relayURL,
    httpURL: `http://127.0.0.1:${relayPort}`,
    metricsURL: `http://127.0.0.1:${metricsPort}`,
    dataDir,
    logPath,
    pid: child.pid,
    /** log returns the last `lines` lines of graspd's log. */
    log(lines = 40) {
      try {
        return readFileSync(logPath, 'utf8').trimEnd().split('\n').slice(-lines).join('\n');
      } catch {
        return '(no log)';
      }
    },
    /** alive reports whether the process is still running. */
    alive() { return exited === null; },
    /** stop ends the process (SIGTERM, SIGKILL after graceMs) and removes its data unless keep. */
    async stop({ graceMs = 10_000, keep = false } = {}) {
      if (exited === null) {
        child.kill('SIGTERM');
        const t = sleep(graceMs).then(() => 'timeout');
        if ((await Promise.race([exitedPromise, t])) === 'timeout') {
          child.kill('SIGKILL');
          await exitedPromise;
        }
      }
      dataDirs.delete(dataDir);
      if (!keep) rmSync(dataDir, { recursive: true, force: true });
    },
  };

  const deadline = Date.now() + readyTimeoutMs;
  while (Date.now() < deadline) {
    if (exited !== null) {
      const err = new Error(`graspd exited during start (${JSON.stringify(exited)}):\n${handle.log()}`);
      err.exitedEarly = true;
      await handle.stop();
      throw err;
    }
    if ((await httpStatus(`${handle.metricsURL}/readyz`)) === 200 &&
        (await httpStatus(handle.httpURL, { Accept: 'application/nostr+json' })) === 200) {
      return handle;
    }
    await sleep(100);
  }
  const log = handle.log();
  await handle.stop();
  throw new Error(`graspd not ready within ${readyTimeoutMs} ms:\n${log}`);
}

async function httpStatus(url, headers = {}) {
  try {
    const res = await fetch(url, { headers, signal: AbortSignal.timeout(2_000) });
    await res.arrayBuffer();
    return res.status;
  } catch {
    return 0;
  }
}
