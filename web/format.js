// Small pure formatters for the dashboard: peer ids, spans, addresses, numbers, times.
// Knows nothing about fetching or the DOM.

export function shortPeer(peerId) {
  if (!peerId) return "?";
  return peerId.length > 14 ? `${peerId.slice(0, 8)}…${peerId.slice(-4)}` : peerId;
}

export function spanText(record) {
  if (record.start_block == null || record.end_block == null) return "—";
  return `[${record.start_block}, ${record.end_block})`;
}

export function hostPort(addr) {
  try {
    const url = new URL(addr);
    return url.host;
  } catch (_) {
    return addr;
  }
}

export function number(value, digits = 1) {
  if (value == null || Number.isNaN(value)) return "—";
  if (Math.abs(value) >= 1000) return value.toLocaleString("en-US", { maximumFractionDigits: 0 });
  return value.toFixed(digits);
}

export function cacheInUse(record) {
  const total = record.cache_tokens_total;
  if (!total) return "—";
  const used = total - record.cache_tokens_left;
  return `${used.toLocaleString("en-US")} / ${total.toLocaleString("en-US")}`;
}

export function expiresIn(expiresAt, now) {
  const s = Math.round(expiresAt - now);
  if (s < 0) return `expired ${-s}s ago`;
  if (s < 120) return `${s}s`;
  return `${Math.round(s / 60)}min`;
}

// `drift up <model> --join drift://<peer_id>@<host>:<port>[?key=...]` from the node's own record.
// The command another machine runs to join. The key itself is never part of it: a private
// swarm's joiners pass a copy of its key file.
export function joinCommand(model, peerId, addr, isPrivate) {
  const where = hostPort(addr);
  const plain = addr.startsWith("http://") ? "?tls=off" : "";
  const key = isPrivate ? " --swarm_key_file swarm.key" : "";
  return `drift up ${model || "<model>"} --join drift://${peerId}@${where}${plain}${key}`;
}
