// mlx-spec's web chat: streams /v1/chat/completions over fetch + SSE, colours tokens by origin, shows live stats.
"use strict";

const $ = (id) => document.getElementById(id);
const conversation = [];  // the conversation sent with every request: the server reuses its cached prefix
let controller = null;  // aborts the reply in flight (the server stops generating within one round)

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api-key").value || localStorage.getItem("mlx-spec-key");
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

function showError(text) {
  $("error").textContent = text;
  $("error").hidden = !text;
}

async function errorText(resp) {
  if (resp.status === 401) $("key-label").hidden = false;
  try { return (await resp.json()).error.message; } catch { return `HTTP ${resp.status}`; }
}

async function loadPair() {
  const resp = await fetch("/v1/models", { headers: headers() });
  if (!resp.ok) { $("pair").textContent = "model info unavailable"; showError(await errorText(resp)); return; }
  const m = (await resp.json()).data[0];
  const info = m.mlx_spec || {};
  $("pair").textContent = `target ${info.target_name || m.id}  ·  draft ${info.draft_name || "?"}`;
  $("pair").title = `target: ${info.target}\ndraft: ${info.draft}` + (info.num_draft ? `\nK: ${info.num_draft}` : "");
}

function addMessage(role, text) {
  const div = document.createElement("div");
  div.className = `msg ${role}`;
  div.innerHTML = `<div class="who"></div><div class="text"></div>`;
  div.querySelector(".who").textContent = role;
  div.querySelector(".text").textContent = text;
  $("log").appendChild(div);
  $("log").scrollTop = $("log").scrollHeight;
  return div;
}

function pct(x) { return `${(100 * x).toFixed(1)} %`; }

// The panel while streaming: counters from each chunk, tokens/s timed here from the first token.
function showLive(live, t0, draftTokens) {
  const secs = (performance.now() - t0) / 1000;
  $("s-tps").textContent = secs > 0 && live.tokens > 1 ? ((live.tokens - 1) / secs).toFixed(1) : "–";
  $("s-accept").textContent = live.drafted ? pct(live.accepted / live.drafted) : "–";
  $("s-mean").textContent = live.spec_rounds ? (live.accepted / live.spec_rounds).toFixed(2) : "–";
  $("s-share").textContent = live.tokens ? pct(draftTokens / live.tokens) : "–";
  $("s-counts").textContent = `${live.drafted} / ${live.accepted}`;
  $("s-rounds").textContent = `${live.tokens} / ${live.rounds}`;
}

// The panel at the end: the server's own measurements.
function showFinal(s) {
  $("s-tps").textContent = s.tokens_per_second.toFixed(1);
  $("s-accept").textContent = s.drafted ? pct(s.acceptance_rate) : "no drafts";
  $("s-mean").textContent = s.mean_accepted.toFixed(2);
  $("s-share").textContent = pct(s.draft_share);
  $("s-counts").textContent = `${s.drafted} / ${s.accepted}`;
  $("s-rounds").textContent = `${s.generation_tokens} / ${s.rounds}`;
  $("s-prompt").textContent = `${s.prompt_tokens} (${s.prompt_cached})`;
  drawChart(s.acceptance_by_position || []);
}

function drawChart(rates) {
  const c = $("chart"), dpr = window.devicePixelRatio || 1;
  const W = 280, H = 150, pad = { l: 34, r: 6, t: 16, b: 22 };
  c.width = W * dpr; c.height = H * dpr;
  const g = c.getContext("2d");
  g.scale(dpr, dpr);
  g.clearRect(0, 0, W, H);
  g.font = "11px system-ui, sans-serif";
  g.fillStyle = "#6b7385"; g.strokeStyle = "#dfe3ea";
  for (const y of [0, 0.5, 1]) {  // grid lines at 0, 50, 100 %
    const py = pad.t + (1 - y) * (H - pad.t - pad.b);
    g.beginPath(); g.moveTo(pad.l, py); g.lineTo(W - pad.r, py); g.stroke();
    g.fillText(`${y * 100}%`, 2, py + 4);
  }
  if (!rates.length) { g.fillText("no draft tokens yet", pad.l + 8, H / 2); return; }
  const slot = (W - pad.l - pad.r) / rates.length;
  rates.forEach((r, i) => {
    const h = r * (H - pad.t - pad.b), x = pad.l + i * slot + slot * 0.15;
    g.fillStyle = "#2e9d52";
    g.fillRect(x, H - pad.b - h, slot * 0.7, h);
    g.fillStyle = "#6b7385";
    g.fillText(String(i + 1), x + slot * 0.35 - 3, H - 6);
    if (slot >= 26) g.fillText(`${Math.round(100 * r)}`, x + slot * 0.35 - 6, H - pad.b - h - 3);
  });
}

// Server-sent events from a fetch body: yields each event's data string.
async function* sse(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf = (buf + value).replace(/\r\n?/g, "\n");
    let end;
    while ((end = buf.indexOf("\n\n")) >= 0) {
      const block = buf.slice(0, end);
      buf = buf.slice(end + 2);
      const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).replace(/^ /, ""));
      if (data.length) yield data.join("\n");
    }
  }
}

async function send(text) {
  showError("");
  conversation.push({ role: "user", content: text });
  addMessage("user", text);
  const msg = addMessage("assistant", "");
  const out = msg.querySelector(".text");
  controller = new AbortController();
  $("send").disabled = true; $("stop").disabled = false;
  let reply = "", draftTokens = 0, t0 = null;
  try {
    const resp = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(), signal: controller.signal,
      body: JSON.stringify({
        model: "mlx-spec", messages: conversation, stream: true, stream_options: { include_usage: true },
        max_tokens: Number($("max-tokens").value) || undefined, temperature: Number($("temperature").value),
      }),
    });
    if (!resp.ok) throw new Error(await errorText(resp));
    for await (const data of sse(resp.body)) {
      if (data === "[DONE]") break;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message);
      const extra = chunk.mlx_spec;
      if (!extra) continue;
      if (extra.pieces) {
        t0 = t0 ?? performance.now();
        extra.pieces.forEach((piece, i) => {
          const span = document.createElement("span");
          span.className = `tok ${extra.draft[i] ? "draft" : "target"}`;
          span.textContent = piece;
          out.appendChild(span);
          draftTokens += extra.draft[i] ? 1 : 0;
          reply += piece;
        });
        showLive(extra, t0, draftTokens);
        $("log").scrollTop = $("log").scrollHeight;
      } else {
        showFinal(extra);
        const note = document.createElement("div");
        note.className = "finish";
        note.textContent = `${extra.generation_tokens} tokens · ${extra.tokens_per_second.toFixed(1)} tok/s · ` +
          `${pct(extra.draft_share)} from drafts · finish: ${extra.finish_reason}`;
        msg.appendChild(note);
      }
    }
    conversation.push({ role: "assistant", content: reply });
  } catch (e) {
    if (e.name === "AbortError") conversation.push({ role: "assistant", content: reply });  // keep what came
    else { showError(e.message); conversation.pop(); }  // the turn failed: it is not part of the conversation
  } finally {
    controller = null;
    $("send").disabled = false; $("stop").disabled = true;
  }
}

$("form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const text = $("prompt").value.trim();
  if (!text || controller) return;
  $("prompt").value = "";
  send(text);
});
$("prompt").addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && !ev.shiftKey) { ev.preventDefault(); $("form").requestSubmit(); }
});
$("stop").addEventListener("click", () => controller && controller.abort());
$("reset").addEventListener("click", () => { conversation.length = 0; $("log").textContent = ""; showError(""); });
$("api-key").addEventListener("change", () => { localStorage.setItem("mlx-spec-key", $("api-key").value); loadPair(); });
drawChart([]);
loadPair();
