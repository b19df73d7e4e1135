// The "Load" card: the swarm's total tokens/s, then for each server small charts of its
// steps/s, tokens/s, active sessions and cache use over the last 10 minutes (LoadHistory).
import { lineChart } from "./charts.js";
import { number, shortPeer, spanText } from "./format.js";

const METRICS = [
  ["steps", "steps/s", (v) => number(v)],
  ["tokens", "tokens/s", (v) => number(v)],
  ["sessions", "sessions", (v) => String(v)],
  ["cache", "cache in use", (v) => `${Math.round(v * 100)}%`],
];

export function renderLoad(totalRoot, serversRoot, history, records) {
  const { windowS, now } = history;
  totalRoot.replaceChildren(lineChart(history.totalSeries(), {
    label: "swarm tokens/s (through the whole model)", metric: "total-tokens", windowS, now,
    format: (v) => number(v),
  }));
  const servers = records
    .filter((r) => r.role === "server" && r.state !== "offline")
    .sort((a, b) => (a.start_block ?? 0) - (b.start_block ?? 0) || a.peer_id.localeCompare(b.peer_id));
  serversRoot.replaceChildren(...servers.map((r) => {
    const card = document.createElement("div");
    card.className = "load-server";
    card.setAttribute("data-testid", "load-server");
    card.dataset.peerId = r.peer_id;
    const head = document.createElement("div");
    head.className = "load-head";
    head.title = r.peer_id;
    head.textContent = `${shortPeer(r.peer_id)} ${spanText(r)}`;
    const charts = document.createElement("div");
    charts.className = "load-charts";
    charts.append(...METRICS.map(([metric, label, format]) => lineChart(
      history.series(r.peer_id, metric),
      { label, metric, peerId: r.peer_id, windowS, now, format, minMax: metric === "cache" ? 1 : 0 })));
    card.append(head, charts);
    return card;
  }));
}
