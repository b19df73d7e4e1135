// Talks to the node that served this page: GET /health, /swarm, /swarm/coverage, /blocks.
// Knows nothing about the DOM. Every request has a timeout. A swarm key never leaves the page:
// each request carries an X-Drift-Auth proof (HMAC-SHA256 over method, path, query, the node's
// peer id, time, a nonce and the body hash, computed with WebCrypto), as drift/wire/auth.py
// defines it.

export class AuthRequired extends Error {}
export class Unreachable extends Error {}

const TIMEOUT_MS = 4000;
const EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
const encoder = new TextEncoder();

function hex(bytes) {
  return [...new Uint8Array(bytes)].map((b) => b.toString(16).padStart(2, "0")).join("");
}

// X-Drift-Auth for a GET of `path` (relative to this page) on the node `peerId`.
export async function proofHeader(key, path, peerId) {
  if (!(globalThis.crypto && crypto.subtle)) {
    throw new Unreachable("proving the swarm key needs https:// (or localhost): open the "
      + "dashboard through the node's TLS address");
  }
  const url = new URL(path, location.href);
  const pairs = [...url.searchParams].sort((a, b) => (a[0] + "\0" + a[1] < b[0] + "\0" + b[1] ? -1 : 1));
  const t = (Date.now() / 1000).toFixed(3);
  const n = hex(crypto.getRandomValues(new Uint8Array(16)));
  const fields = ["drift-auth-2", "GET", url.pathname, JSON.stringify(pairs), peerId, t, n, EMPTY_SHA256];
  const hmacKey = await crypto.subtle.importKey(
    "raw", encoder.encode(key), { name: "HMAC", hash: "SHA-256" }, false, ["sign"]);
  const mac = hex(await crypto.subtle.sign("HMAC", hmacKey, encoder.encode(fields.join("\n"))));
  return `v=2,t=${t},n=${n},to=${peerId},h=${EMPTY_SHA256},mac=${mac}`;
}

async function getJSON(path, key, { allow404 = false, peerId = null } = {}) {
  const headers = { Accept: "application/json" };
  if (key && peerId) headers["X-Drift-Auth"] = await proofHeader(key, path, peerId);
  let resp;
  try {
    resp = await fetch(path, { headers, cache: "no-store", signal: AbortSignal.timeout(TIMEOUT_MS) });
  } catch (err) {
    throw new Unreachable(`${path}: ${err.message || err}`);
  }
  if (resp.status === 401 || resp.status === 403) throw new AuthRequired(path);
  if (allow404 && resp.status === 404) return null;
  if (!resp.ok) {
    let message = `${resp.status} ${resp.statusText}`;
    try {
      const body = await resp.json();
      if (body && body.error && body.error.message) message = `${resp.status}: ${body.error.message}`;
    } catch (_) { /* not JSON */ }
    throw new Unreachable(`${path}: ${message}`);
  }
  return resp.json();
}

// Models in the swarm, from the records: [{model, model_fingerprint, num_blocks}], by name.
export function modelsIn(records) {
  const seen = new Map();
  for (const r of records) {
    if (r.model_fingerprint && r.state !== "offline" && !seen.has(r.model_fingerprint)) {
      seen.set(r.model_fingerprint, { model: r.model, model_fingerprint: r.model_fingerprint, num_blocks: r.num_blocks });
    }
  }
  return [...seen.values()].sort((a, b) => (a.model || "").localeCompare(b.model || ""));
}

// The model to show: the one asked for while it is still served, else this node's own, else
// the first by name. (/swarm/coverage without ?model= is an error when several are served.)
function pickModel(wanted, records, blocks) {
  const models = modelsIn(records);
  const has = (fp) => models.some((m) => m.model_fingerprint === fp);
  if (wanted && has(wanted)) return wanted;
  if (blocks && blocks.model_fingerprint && has(blocks.model_fingerprint)) return blocks.model_fingerprint;
  return models.length ? models[0].model_fingerprint : null;
}

// One snapshot of everything the dashboard shows. `model` is the wanted fingerprint or null.
export async function fetchSnapshot(key, model) {
  const health = await getJSON("health", null);  // open: it names the node proofs are for
  const peerId = health.peer_id;
  const [swarm, blocks] = await Promise.all([
    getJSON("swarm", key, { peerId }),
    getJSON("blocks", key, { allow404: true, peerId }).catch((err) => {
      if (err instanceof AuthRequired) throw err;
      return null; // a node without blocks, or an older node: not fatal
    }),
  ]);
  const chosen = pickModel(model, swarm.records, blocks);
  const coverage = await getJSON(
    chosen ? `swarm/coverage?model=${encodeURIComponent(chosen)}` : "swarm/coverage", key,
    { peerId });
  return { health, swarm, coverage, blocks, fetchedAt: Date.now() / 1000 };
}
