// The dashboard's memory of the swarm's load: for every server, steps/s, tokens/s, active
// sessions and cache use, plus the swarm's total tokens/s and this node's latency to each
// peer, over the last 10 minutes. Kept in the page (nothing is stored on the node): one
// sample per poll, from the records the node serves at /swarm (servers announce steps_per_s
// and tokens_per_s in their signed records) and its measured round trips (latency_ms).
// Knows nothing about fetching or the DOM.

export const WINDOW_S = 600;

// Share of a server's KV cache in use, 0..1 (null without a cache).
export function cacheUse(record) {
  const total = record.cache_tokens_total;
  return total ? (total - record.cache_tokens_left) / total : null;
}

// Tokens/s through the whole model that a server's work stands for: a token through k of the
// model's n blocks counts k/n (the server announces tokens x blocks per second), so a chain of
// servers counts each token once.
export function fullModelTokensPerS(record) {
  const n = record.num_blocks;
  return n ? (record.block_tokens_per_s || 0) / n : 0;
}

export class LoadHistory {
  constructor(windowS = WINDOW_S) {
    this.windowS = windowS;
    this.servers = new Map();  // peer id -> [{t, steps, tokens, sessions, cache}]
    this.latency = new Map();  // peer id -> [{t, ms}]
    this.total = [];           // [{t, tokens}]: the swarm's full-model tokens/s
    this.now = 0;
  }

  add(snapshot) {
    const t = snapshot.fetchedAt;
    this.now = t;
    let total = 0;
    for (const r of snapshot.swarm.records) {
      if (r.role !== "server" || r.state === "offline") continue;
      push(this.servers, r.peer_id, {
        t, steps: r.steps_per_s || 0, tokens: r.tokens_per_s || 0,
        sessions: r.active_sessions, cache: cacheUse(r),
      });
      total += fullModelTokensPerS(r);
    }
    this.total.push({ t, tokens: total });
    for (const [peer, ms] of Object.entries(snapshot.swarm.latency_ms || {})) {
      push(this.latency, peer, { t, ms });
    }
    this.prune(t - this.windowS);
  }

  prune(since) {
    for (const map of [this.servers, this.latency]) {
      for (const [peer, samples] of map) {
        const kept = samples.filter((s) => s.t >= since);
        if (kept.length) map.set(peer, kept); else map.delete(peer);
      }
    }
    this.total = this.total.filter((s) => s.t >= since);
  }

  // [[t, value]] of one metric of one server ("steps" | "tokens" | "sessions" | "cache").
  series(peerId, metric) {
    return (this.servers.get(peerId) || []).filter((s) => s[metric] != null).map((s) => [s.t, s[metric]]);
  }

  totalSeries() {
    return this.total.map((s) => [s.t, s.tokens]);
  }

  latestLatency(peerId) {
    const samples = this.latency.get(peerId);
    return samples && samples.length ? samples[samples.length - 1].ms : null;
  }
}

function push(map, key, sample) {
  if (!map.has(key)) map.set(key, []);
  map.get(key).push(sample);
}
