// Talks to the node that served this page: GET /health, /swarm, /swarm/coverage, /blocks.
// Knows nothing about the DOM. Every request has a timeout; a swarm key, when given, is sent
// as `Authorization: Bearer <key>`.

export class AuthRequired extends Error {}
export class Unreachable extends Error {}

const TIMEOUT_MS = 4000;

async function getJSON(path, key, { allow404 = false } = {}) {
  const headers = { Accept: "application/json" };
  if (key) headers.Authorization = `Bearer ${key}`;
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
  const [health, swarm, blocks] = await Promise.all([
    getJSON("health", key),
    getJSON("swarm", key),
    getJSON("blocks", key, { allow404: true }).catch((err) => {
      if (err instanceof AuthRequired) throw err;
      return null; // a node without blocks, or an older node: not fatal
    }),
  ]);
  const chosen = pickModel(model, swarm.records, blocks);
  const coverage = await getJSON(
    chosen ? `swarm/coverage?model=${encodeURIComponent(chosen)}` : "swarm/coverage", key);
  return { health, swarm, coverage, blocks, fetchedAt: Date.now() / 1000 };
}
