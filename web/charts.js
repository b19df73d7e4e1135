// Small SVG line charts (sparklines) of a time series over a fixed window, built with DOM
// calls only. Knows nothing about fetching or what the numbers mean.

const SVG = "http://www.w3.org/2000/svg";
const W = 300;
const H = 60;

function svg(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  return node;
}

// points: [[t, value]]; the x axis spans [now - windowS, now]; y from 0 to the series' max
// (at least `minMax`, e.g. 1 for a share). Returns <figure data-testid="load-chart">.
export function lineChart(points, { label, metric, peerId = null, windowS, now, minMax = 0, format }) {
  const figure = document.createElement("figure");
  figure.className = "chart";
  figure.setAttribute("data-testid", "load-chart");
  figure.dataset.metric = metric;
  if (peerId) figure.dataset.peerId = peerId;
  figure.dataset.points = String(points.length);
  const last = points.length ? points[points.length - 1][1] : null;
  const peak = points.reduce((m, p) => Math.max(m, p[1]), 0);
  figure.dataset.last = last == null ? "" : String(last);
  figure.dataset.max = String(peak);

  const caption = document.createElement("figcaption");
  const name = document.createElement("span");
  name.textContent = label;
  const value = document.createElement("b");
  value.textContent = last == null ? "—" : format(last);
  caption.append(name, value);

  const top = Math.max(peak, minMax) || 1;
  const chart = svg("svg", { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none", role: "img",
    "aria-label": `${label}: ${last == null ? "no data" : format(last)} now, peak ${format(peak)}` });
  chart.append(svg("line", { x1: 0, y1: H - 0.5, x2: W, y2: H - 0.5, class: "axis" }));
  const x = (t) => Math.max(0, Math.min(W, ((t - (now - windowS)) / windowS) * W));
  const y = (v) => H - 2 - (v / top) * (H - 4);
  if (points.length) {
    const coords = points.map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`);
    const first = points[0];
    const end = points[points.length - 1];
    chart.append(svg("polygon", { class: "area",
      points: `${x(first[0]).toFixed(1)},${H} ${coords.join(" ")} ${x(end[0]).toFixed(1)},${H}` }));
    chart.append(svg("polyline", { class: "line", points: coords.join(" ") }));
  }
  figure.append(caption, chart);
  return figure;
}
