// Builds the dashboard's DOM from one snapshot: the coverage map and the servers table.
// Pure DOM construction with textContent only (peer data is never parsed as HTML);
// knows nothing about fetching or timing.
import { cacheInUse, expiresIn, hostPort, number, shortPeer, spanText } from "./format.js";

function el(tag, attrs = {}, text = null) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value == null) continue;
    if (name === "class") node.className = value;
    else node.setAttribute(name, String(value));
  }
  if (text != null) node.textContent = String(text);
  return node;
}

// Non-overlapping spans share a lane; replicas of the same blocks stack in further lanes.
function assignLanes(records) {
  const laneEnds = [];
  const placed = [];
  const sorted = [...records].sort((a, b) => a.start_block - b.start_block || b.end_block - a.end_block);
  for (const record of sorted) {
    let lane = laneEnds.findIndex((end) => end <= record.start_block);
    if (lane === -1) { lane = laneEnds.length; laneEnds.push(0); }
    laneEnds[lane] = record.end_block;
    placed.push({ record, lane });
  }
  return { placed, lanes: laneEnds.length };
}

export function modelRecords(records, coverage) {
  return records.filter((r) => r.start_block != null && r.end_block != null
    && (r.model_fingerprint === coverage.model_fingerprint
        || (!coverage.model_fingerprint && r.model === coverage.model)));
}

export function renderCoverage(root, coverage, records) {
  const n = coverage.num_blocks || 0;
  root.replaceChildren();
  if (!coverage.model || n === 0) {
    root.append(el("p", { class: "muted", "data-testid": "no-model" }, "No model is served in this swarm yet."));
    return;
  }
  const { placed, lanes } = assignLanes(modelRecords(records, coverage));
  root.style.setProperty("--blocks", n);
  const grid = el("div", { class: "coverage-grid", "data-testid": "coverage-grid" });
  grid.style.gridTemplateRows = `auto repeat(${Math.max(lanes, 1)}, var(--lane-h)) auto`;
  for (let i = 0; i < n; i++) {           // axis: block indices
    const tick = el("div", { class: "tick" }, i % 5 === 0 || n <= 32 ? i : "");
    tick.style.gridColumn = `${i + 1}`; tick.style.gridRow = "1";
    grid.append(tick);
  }
  for (const { record, lane } of placed) { // one bar per server span
    const bar = el("div", {
      class: `bar ${record.state}${stateMarks(record).map((m) => " " + m).join("")}`,
      "data-testid": "coverage-bar", "data-peer-id": record.peer_id,
      "data-start-block": record.start_block, "data-end-block": record.end_block, "data-state": record.state,
      title: `${record.peer_id}\n${spanText(record)} ${stateText(record)}, ${number(record.throughput)} tok/s/block`,
    }, `${shortPeer(record.peer_id)} ${spanText(record)}`);
    bar.style.gridColumn = `${record.start_block + 1} / ${record.end_block + 1}`;
    bar.style.gridRow = `${lane + 2}`;
    grid.append(bar);
  }
  const missing = new Set(coverage.missing);
  for (const block of coverage.blocks) {  // per-block summed throughput; missing in red
    const isMissing = missing.has(block.index);
    const cell = el("div", {
      class: `block${isMissing ? " missing" : ""}`, "data-testid": "coverage-block",
      "data-block": block.index, "data-missing": isMissing ? "true" : "false",
      title: isMissing ? `block ${block.index}: no online server`
        : `block ${block.index}: ${block.peers.length} server(s), ${number(block.throughput)} tok/s`,
    }, isMissing ? "✕" : number(block.throughput, 0));
    cell.style.gridColumn = `${block.index + 1}`; cell.style.gridRow = `${Math.max(lanes, 1) + 2}`;
    grid.append(cell);
  }
  root.append(grid);
}

export function coverageSummary(coverage) {
  if (!coverage.model) return "";
  const m = coverage.missing.length;
  const base = `${coverage.model} · ${coverage.num_blocks} blocks`;
  return m === 0 ? `${base} · complete` : `${base} · ${m} missing: ${ranges(coverage.missing)}`;
}

// [3, 4, 5, 9] -> "3–5, 9"
export function ranges(indices) {
  const out = [];
  for (let i = 0; i < indices.length; i++) {
    let j = i;
    while (j + 1 < indices.length && indices[j + 1] === indices[j] + 1) j++;
    out.push(i === j ? `${indices[i]}` : `${indices[i]}–${indices[j]}`);
    i = j;
  }
  return out.join(", ");
}

// The LoRA adapters a server holds beside its blocks (drift server --adapters).
function adaptersText(r) {
  return r.adapters && r.adapters.length ? ` + LoRA ${r.adapters.join(", ")}` : "";
}

function adaptersTitle(r) {
  return r.adapters && r.adapters.length ? `LoRA adapters: ${r.adapters.join(", ")}` : null;
}

// `latency(peerId)`: this node's measured round trip to the peer in ms, or null.
export function renderServers(tbody, records, selfPeerId, now, latency = () => null) {
  const sorted = [...records].sort((a, b) =>
    (a.model || "").localeCompare(b.model || "") || (a.start_block ?? -1) - (b.start_block ?? -1)
    || a.peer_id.localeCompare(b.peer_id));
  tbody.replaceChildren(...sorted.map((r) => {
    const row = el("tr", {
      "data-testid": "server-row", "data-peer-id": r.peer_id, "data-state": r.state,
      "data-start-block": r.start_block, "data-end-block": r.end_block,
      class: [r.state, ...stateMarks(r)].join(" "),
    });
    const peer = el("td", { class: "peer", title: r.peer_id }, shortPeer(r.peer_id));
    if (r.peer_id === selfPeerId) peer.append(el("span", { class: "self" }, " (this node)"));
    row.append(
      peer,
      el("td", { "data-testid": "state" }, r.role === "dht" ? `${r.state} · dht` : stateText(r)),
      el("td", { class: "addr" }, r.addrs.map(hostPort).join(" ")),
      el("td", { "data-testid": "model", title: adaptersTitle(r) },
        r.model ? r.model + adaptersText(r) : "—"),
      el("td", { "data-testid": "span" }, spanText(r)),
      el("td", { "data-testid": "dtype" }, r.dtype || "—"),
      el("td", { "data-testid": "quant" }, r.quant || "—"),
      el("td", { class: "num" }, r.role === "dht" ? "—" : number(r.throughput)),
      el("td", { class: "num", "data-testid": "cache" }, cacheInUse(r)),
      el("td", { class: "num", "data-testid": "sessions", title: "stepping + held (open, idle: prefixes)" },
        r.role === "dht" ? "—" : sessionsText(r)),
      el("td", { class: "num", "data-testid": "latency" }, r.peer_id === selfPeerId ? "—"
        : latency(r.peer_id) == null ? "—" : `${number(latency(r.peer_id))} ms`),
      el("td", { "data-testid": "version", title: r.protocol ? `wire protocol ${r.protocol}` : null },
        r.protocol ? `${r.version} · wire ${r.protocol}` : r.version),
      el("td", { title: new Date(r.expires_at * 1000).toISOString() }, expiresIn(r.expires_at, now)),
    );
    return row;
  }));
}

// What a server's record says beside its state: "draining" (it hands its sessions over and
// takes no new ones: a graceful stop or a span move) and "degraded" (its watchdog saw its
// compute stall with work queued: routing avoids it). Both are optional record fields.
export function stateMarks(r) {
  const marks = [];
  if (r.draining) marks.push("draining");
  if (r.degraded_s > 0) marks.push("degraded");
  return marks;
}

export function stateText(r) {
  return [r.state, ...stateMarks(r)].join(" · ");
}

// "2" stepping sessions, or "2 +7 held" when some open sessions are idle (a held prefix).
export function sessionsText(r) {
  const held = Math.min(r.held_sessions || 0, r.active_sessions);
  return held ? `${r.active_sessions - held} +${held} held` : String(r.active_sessions);
}
