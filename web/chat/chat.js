// DRIFT chat page: a conversation with the model behind `drift api`, streamed token by token.
// Uses only the API's routes (GET /v1/models, POST /v1/chat/completions with stream: true)
// and the API key typed in (kept in this browser's localStorage). Shows tokens/s and the
// servers that ran the blocks (`drift_route` of the last chunk). No build step.

const $ = (id) => document.querySelector(`[data-testid=${id}]`);
const KEY = "drift-api-key";
const history = []; // {role, content} sent with every request
let controller = null;

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

function status(text, error = false) {
  const el = $("status");
  el.textContent = text;
  el.classList.toggle("error", error);
}

async function errorText(resp) {
  try {
    const body = await resp.json();
    if (body.error && body.error.message) return `${resp.status}: ${body.error.message}`;
  } catch (_) { /* not JSON */ }
  return `${resp.status} ${resp.statusText}`;
}

async function loadModels() {
  const resp = await fetch("/v1/models", { headers: headers(), cache: "no-store" });
  if (resp.status === 401) {
    status("this API needs a key: type it above", true);
    $("api-key").focus();
    return;
  }
  if (!resp.ok) throw new Error(await errorText(resp));
  const picker = $("model-picker");
  const wanted = picker.value;
  picker.replaceChildren();
  for (const m of (await resp.json()).data) {
    picker.append(new Option(m.id, m.id, false, m.id === wanted));
  }
  status(`${picker.options.length} model${picker.options.length === 1 ? "" : "s"}`);
  document.body.dataset.state = "ready";
}

function bubble(role, text = "") {
  const el = document.createElement("div");
  el.className = `msg ${role}`;
  el.dataset.role = role;
  const body = document.createElement("span");
  body.className = "text";
  body.dataset.testid = role === "user" ? "user-text" : "assistant-text";
  body.textContent = text;
  el.append(body);
  $("conversation").append(el);
  el.scrollIntoView({ block: "end" });
  return el;
}

function describeRoute(route) {
  if (!route || !route.length) return "";
  const short = (id) => (id.length > 14 ? `${id.slice(0, 8)}…${id.slice(-4)}` : id);
  return " · served by " + route.map((s) => `${short(s.peer_id)} [${s.start_block}, ${s.end_block})`).join(", ");
}

// Yields the JSON payload of every `data:` event until `data: [DONE]`.
async function* events(resp) {
  const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        const data = line.slice(6);
        if (data === "[DONE]") return;
        yield JSON.parse(data);
      }
    }
  }
}

async function send(text) {
  const system = $("system-prompt").value.trim();
  history.push({ role: "user", content: text });
  bubble("user", text);
  const reply = bubble("assistant");
  const out = reply.querySelector(".text");
  reply.dataset.done = "false";
  const body = {
    model: $("model-picker").value,
    messages: system ? [{ role: "system", content: system }, ...history] : [...history],
    temperature: Number($("temperature").value),
    stream: true,
    stream_options: { include_usage: true },
  };
  controller = new AbortController();
  $("stop").hidden = false;
  $("send").disabled = true;
  const started = performance.now();
  let first = null, tokens = 0, route = null, finish = null;
  try {
    const resp = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(), body: JSON.stringify(body), signal: controller.signal,
    });
    if (!resp.ok) throw new Error(await errorText(resp));
    for await (const chunk of events(resp)) {
      if (chunk.error) throw new Error(chunk.error.message);
      if (chunk.usage) tokens = chunk.usage.completion_tokens;
      if (chunk.drift_route) route = chunk.drift_route;
      for (const choice of chunk.choices || []) {
        const piece = choice.delta && choice.delta.content;
        if (piece) {
          if (first === null) first = performance.now();
          out.textContent += piece;
          reply.scrollIntoView({ block: "end" });
        }
        finish = choice.finish_reason || finish;
      }
    }
    history.push({ role: "assistant", content: out.textContent });
    const seconds = first === null ? 0 : (performance.now() - first) / 1000;
    const rate = tokens > 1 && seconds > 0 ? `${((tokens - 1) / seconds).toFixed(1)} tokens/s` : `${tokens} tokens`;
    const meta = document.createElement("span");
    meta.className = "meta";
    meta.dataset.testid = "reply-meta";
    const ttft = first === null ? "" : ` · first token ${((first - started) / 1000).toFixed(2)} s`;
    meta.textContent = `${rate}${ttft}${finish ? ` · ${finish}` : ""}${describeRoute(route)}`;
    reply.append(meta);
    status("ready");
  } catch (err) {
    reply.classList.add("error");
    if (err.name === "AbortError") {
      history.push({ role: "assistant", content: out.textContent });
      status("stopped");
    } else {
      out.textContent += (out.textContent ? "\n" : "") + String(err.message || err);
      history.pop();
      status("request failed", true);
    }
  } finally {
    reply.dataset.done = "true";
    controller = null;
    $("stop").hidden = true;
    $("send").disabled = false;
  }
}

function main() {
  $("api-key").value = localStorage.getItem(KEY) || "";
  $("api-key").addEventListener("change", () => {
    localStorage.setItem(KEY, $("api-key").value.trim());
    loadModels().catch((err) => status(String(err.message || err), true));
  });
  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    const text = $("message-input").value.trim();
    if (!text || controller) return;
    $("message-input").value = "";
    send(text);
  });
  $("message-input").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) {
      event.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", () => controller && controller.abort());
  $("new-chat").addEventListener("click", () => {
    history.length = 0;
    $("conversation").replaceChildren();
  });
  loadModels().catch((err) => status(String(err.message || err), true));
}

main();
