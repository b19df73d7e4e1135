// The dashboard's composition root: holds the page state (swarm key, chosen model, the load
// history of the last 10 minutes), polls the node every ~2 s, and hands each snapshot to
// the renderers. A failed poll keeps the last
// snapshot on screen and says the node is unreachable; a 401 asks for the swarm key.
import { AuthRequired, fetchSnapshot } from "./api.js";
import { joinCommand, shortPeer, spanText } from "./format.js";
import { LoadHistory } from "./history.js";
import { renderLoad } from "./load.js";
import { coverageSummary, renderCoverage, renderServers } from "./render.js";

const POLL_MS = 2000;
const $ = (id) => document.querySelector(`[data-testid="${id}"]`);

const state = {
  key: keyFromFragment(),
  model: null,        // chosen model fingerprint; null = the node's default
  lastOk: null,       // time of the last good snapshot (ms)
  joinText: "",
  timer: null,
  history: new LoadHistory(),  // the last 10 minutes of load, kept in this page
};

function keyFromFragment() {
  const params = new URLSearchParams(location.hash.replace(/^#/, ""));
  return params.get("key") || sessionStorage.getItem("drift-swarm-key") || null;
}

function setStatus(kind, text) {
  document.body.dataset.state = kind;
  const status = $("status");
  status.className = `status ${kind}`;
  status.textContent = text;
}

function showAuth(message) {
  $("content").hidden = true;
  $("key-form").hidden = false;
  $("servers").querySelector("tbody").replaceChildren();
  $("coverage").replaceChildren();
  setStatus("auth", message);
}

function renderModelPicker(coverage) {
  const picker = $("model-picker");
  const models = coverage.models || [];
  $("model-picker-label").hidden = models.length < 2;
  const wanted = models.map((m) => m.model_fingerprint).join(",");
  if (picker.dataset.models !== wanted) {
    picker.replaceChildren(...models.map((m) => {
      const option = document.createElement("option");
      option.value = m.model_fingerprint;
      option.textContent = `${m.model} (${m.num_blocks} blocks)`;
      return option;
    }));
    picker.dataset.models = wanted;
  }
  picker.value = coverage.model_fingerprint || "";
}

function renderNode(snapshot) {
  const { health, swarm, blocks } = snapshot;
  const own = swarm.records.find((r) => r.peer_id === swarm.peer_id);
  const info = $("node-info");
  info.title = health.peer_id;
  let text = `node ${shortPeer(health.peer_id)} · v${health.version}`;
  if (blocks) text += ` · serves ${blocks.model || ""} ${spanText(blocks)}`;
  info.textContent = text;
  const addr = own && own.addrs.length ? own.addrs[0] : location.origin;
  state.joinText = joinCommand(snapshot.coverage.join_model || snapshot.coverage.model, swarm.peer_id, addr, Boolean(state.key));
  $("join-command").textContent = state.joinText;
}

function render(snapshot) {
  const { swarm, coverage } = snapshot;
  $("key-form").hidden = true;
  $("content").hidden = false;
  renderModelPicker(coverage);
  renderCoverage($("coverage"), coverage, swarm.records);
  $("coverage-summary").textContent = coverageSummary(coverage);
  $("coverage-summary").dataset.incomplete = coverage.missing.length ? "true" : "false";
  state.history.add(snapshot);
  renderServers($("servers").querySelector("tbody"), swarm.records, swarm.peer_id, snapshot.fetchedAt,
    (peer) => state.history.latestLatency(peer));
  renderLoad($("load-total"), $("load-servers"), state.history, swarm.records);
  const online = swarm.records.filter((r) => r.state === "online").length;
  $("servers-summary").textContent = `${swarm.records.length} peers, ${online} online`;
  renderNode(snapshot);
  setStatus("ok", `live · updated ${new Date().toLocaleTimeString()}`);
  document.body.dataset.refreshes = String(Number(document.body.dataset.refreshes) + 1);
}

async function poll() {
  clearTimeout(state.timer);
  try {
    const snapshot = await fetchSnapshot(state.key, state.model);
    state.lastOk = Date.now();
    render(snapshot);
  } catch (err) {
    if (err instanceof AuthRequired) {
      showAuth(state.key ? "The swarm key was refused." : "This swarm needs a key.");
      return; // wait for the form
    }
    const since = state.lastOk ? ` (last update ${Math.round((Date.now() - state.lastOk) / 1000)}s ago)` : "";
    setStatus("unreachable", `node unreachable${since}: ${err.message}`);
    document.body.dataset.refreshes = String(Number(document.body.dataset.refreshes) + 1);
  }
  state.timer = setTimeout(poll, POLL_MS);
}

function wire() {
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    state.key = $("key-input").value.trim() || null;
    if (state.key) sessionStorage.setItem("drift-swarm-key", state.key);
    poll();
  });
  $("model-picker").addEventListener("change", (event) => {
    state.model = event.target.value || null;
    poll();
  });
  $("copy-join").addEventListener("click", async () => {
    const button = $("copy-join");
    try {
      await navigator.clipboard.writeText(state.joinText);
      button.textContent = "Copied";
    } catch (_) {
      const range = document.createRange();   // no clipboard (plain http): select it instead
      range.selectNodeContents($("join-command"));
      getSelection().removeAllRanges();
      getSelection().addRange(range);
      button.textContent = "Press Ctrl+C";
    }
    setTimeout(() => { button.textContent = "Copy"; }, 1500);
  });
  window.addEventListener("hashchange", () => { state.key = keyFromFragment(); poll(); });
}

wire();
poll();
