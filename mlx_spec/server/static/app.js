// mlx-spec's web chat: conversations kept in localStorage, replies streamed from /v1/chat/completions (fetch + SSE)
// and rendered as Markdown as they come (render.js), the live speculation panel, errors as lines in the chat, and a
// reconnect loop when the server goes away.
"use strict";

const $ = (id) => document.getElementById(id);
const STORE = "mlx-spec-chats", OVERLAY = "mlx-spec-overlay", KEY = "mlx-spec-key";
const RECONNECT_MS = 1000;

let server = { drafters: [], switchable: false, draft: "none" };  // /v1/models' mlx_spec field
let state = loadState();  // { chats: [{ id, title, draft, messages: [{ role, content, marks?, note? }] }], current }
let controller = null;  // aborts the reply in flight (the server stops generating within one round)
let reconnecting = false;

// ------------------------------------------------------------------ conversations, kept in the browser

function loadState() {
  try {
    const s = JSON.parse(localStorage.getItem(STORE));
    if (s && Array.isArray(s.chats)) return s;
  } catch { /* a corrupt store starts afresh */ }
  return { chats: [], current: null };
}

function save() {
  try { localStorage.setItem(STORE, JSON.stringify(state)); } catch (e) {
    notice(`Could not save the conversations in this browser (${e.name}): delete old ones to make room.`, "error");
  }
}

function current() {
  let chat = state.chats.find((c) => c.id === state.current);
  if (!chat) {
    chat = { id: `c${Date.now().toString(36)}${Math.random().toString(36).slice(2, 6)}`, title: "New chat",
             draft: null, messages: [] };
    state.chats.unshift(chat);
    state.current = chat.id;
  }
  return chat;
}

function openChat(id) {
  if (controller) controller.abort();
  state.current = id;
  save();
  showChats();
  showLog();
  document.body.classList.remove("nav-open");
}

function newChat() {
  const chat = state.chats.find((c) => c.id === state.current);
  if (chat && !chat.messages.length) { openChat(chat.id); return; }  // an empty one is new already
  state.current = null;
  current();
  openChat(state.current);
  $("prompt").focus();
}

function showChats() {
  const list = $("chat-list");
  list.textContent = "";
  for (const chat of state.chats) {
    const li = document.createElement("li");
    li.className = chat.id === state.current ? "chat active" : "chat";
    li.dataset.id = chat.id;
    li.innerHTML = `<button type="button" class="open"></button>` +
      `<button type="button" class="icon rename" title="rename">&#9998;</button>` +
      `<button type="button" class="icon delete" title="delete">&#10005;</button>`;
    li.querySelector(".open").textContent = chat.title;
    li.querySelector(".open").addEventListener("click", () => openChat(chat.id));
    li.querySelector(".rename").addEventListener("click", () => rename(li, chat));
    li.querySelector(".delete").addEventListener("click", (ev) => remove(ev.currentTarget, chat));
    list.appendChild(li);
  }
}

function rename(li, chat) {
  const input = document.createElement("input");
  input.className = "rename-input";
  input.value = chat.title;
  li.querySelector(".open").replaceWith(input);
  input.focus(); input.select();
  let done = false;
  const finish = (keep) => {
    if (done) return;
    done = true;
    if (keep && input.value.trim()) chat.title = input.value.trim();
    save(); showChats();
  };
  input.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter") { ev.preventDefault(); finish(true); }
    if (ev.key === "Escape") { ev.preventDefault(); ev.stopPropagation(); finish(false); }
  });
  input.addEventListener("blur", () => finish(true));
}

function remove(button, chat) {
  if (!button.classList.contains("armed")) {  // a second click deletes: one stray click loses nothing
    button.classList.add("armed");
    button.textContent = "delete?";
    setTimeout(() => { button.classList.remove("armed"); button.innerHTML = "&#10005;"; }, 3000);
    return;
  }
  if (chat.id === state.current && controller) controller.abort();
  state.chats = state.chats.filter((c) => c !== chat);
  if (state.current === chat.id) state.current = state.chats.length ? state.chats[0].id : null;
  save(); showChats(); showLog();
}

// ------------------------------------------------------------------ the log

function addMessage(role) {
  const div = document.createElement("div");
  div.className = `msg ${role}`;
  div.innerHTML = `<div class="who"></div><div class="text"></div>`;
  div.querySelector(".who").textContent = role;
  $("log").appendChild(div);
  return div;
}

function showMessage(m) {
  const div = addMessage(m.role);
  const out = div.querySelector(".text");
  if (m.role === "assistant") Render.render(out, m.content, m.marks || []);
  else out.textContent = m.content;
  if (m.note) finishNote(div, m.note);
  return div;
}

function finishNote(div, text) {
  const note = document.createElement("div");
  note.className = "finish";
  note.textContent = text;
  div.appendChild(note);
}

function showLog() {
  $("log").textContent = "";
  const chat = current();
  chat.messages.forEach(showMessage);
  const last = chat.messages.filter((m) => m.stats).at(-1);  // the panel shows this conversation's last reply
  if (last) showFinal(last.stats); else clearPanel();
  $("drafter").value = chat.draft && server.drafters.some((d) => d.spec === chat.draft) ? chat.draft : server.draft;
  showK();
  scrollDown(true);
}

// An error or a note, as a line in the chat (not part of the conversation).
function notice(text, kind = "info") {
  const div = document.createElement("div");
  div.className = `notice ${kind}`;
  div.setAttribute("role", kind === "error" ? "alert" : "status");
  div.textContent = text;
  $("log").appendChild(div);
  scrollDown(true);
  return div;
}

function scrollDown(force) {
  const log = $("log");
  if (force || log.scrollHeight - log.scrollTop - log.clientHeight < 80) log.scrollTop = log.scrollHeight;
}

// ------------------------------------------------------------------ the server: pair, drafters, reconnecting

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api-key").value || localStorage.getItem(KEY);
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

async function errorText(resp) {
  try { return (await resp.json()).error.message; } catch { return `HTTP ${resp.status}`; }
}

async function loadPair() {
  let resp;
  try { resp = await fetch("/v1/models", { headers: headers() }); } catch { reconnect(); return; }
  if (!resp.ok) {
    $("pair").textContent = "model info unavailable";
    if (resp.status === 401) $("key-label").hidden = false;
    notice(`${resp.status}: ${await errorText(resp)}`, "error");
    return;
  }
  const m = (await resp.json()).data[0];
  const info = m.mlx_spec || {};
  server = { drafters: info.drafters || [{ spec: info.draft, name: info.draft_name, k: info.num_draft }],
             switchable: !!info.switchable, draft: info.draft };
  $("pair").textContent = `target ${info.target_name || m.id}`;
  $("pair").title = `target: ${info.target}\nserver's drafter: ${info.draft}`;
  const select = $("drafter");
  select.textContent = "";
  for (const d of server.drafters) {
    const opt = document.createElement("option");
    opt.value = d.spec;
    opt.textContent = d.spec === server.draft ? `${d.name} (server's)` : d.name;
    select.appendChild(opt);
  }
  select.disabled = !server.switchable;
  select.title = server.switchable ? "the drafter for the next reply" : "this server's drafter is fixed";
  const chat = current();
  select.value = chat.draft && server.drafters.some((d) => d.spec === chat.draft) ? chat.draft : server.draft;
  showK();
}

function showK() {
  const d = server.drafters.find((x) => x.spec === $("drafter").value);
  $("k").textContent = !d ? "" : d.spec === "none" ? "plain decoding" : `K ${d.k}`;
}

async function reconnect() {
  if (reconnecting) return;
  reconnecting = true;
  $("conn").hidden = false;
  $("conn").textContent = "offline: reconnecting…";
  notice("Lost the connection to the server; reconnecting…", "error");
  for (;;) {
    await new Promise((r) => setTimeout(r, RECONNECT_MS));
    try {
      const resp = await fetch("/health", { cache: "no-store" });
      if (resp.ok) break;
    } catch { /* still away */ }
  }
  reconnecting = false;
  $("conn").hidden = true;
  notice("Reconnected.", "info");
  loadPair();
}

// ------------------------------------------------------------------ the live panel

function pct(x) { return `${(100 * x).toFixed(1)} %`; }

function showLive(live, t0, draftTokens) {
  const secs = (performance.now() - t0) / 1000;
  $("s-tps").textContent = secs > 0 && live.tokens > 1 ? ((live.tokens - 1) / secs).toFixed(1) : "–";
  $("s-accept").textContent = live.drafted ? pct(live.accepted / live.drafted) : "–";
  $("s-mean").textContent = live.spec_rounds ? (live.accepted / live.spec_rounds).toFixed(2) : "–";
  $("s-share").textContent = live.tokens ? pct(draftTokens / live.tokens) : "–";
  $("s-counts").textContent = `${live.drafted} / ${live.accepted}`;
  $("s-rounds").textContent = `${live.tokens} / ${live.rounds}`;
}

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

function clearPanel() {
  for (const dd of document.querySelectorAll("#stats dd")) dd.textContent = "–";
  drawChart([]);
}

function drawChart(rates) {
  const c = $("chart"), dpr = window.devicePixelRatio || 1, css = getComputedStyle(document.body);
  const W = 280, H = 150, pad = { l: 34, r: 6, t: 16, b: 22 };
  c.width = W * dpr; c.height = H * dpr;
  const g = c.getContext("2d");
  g.scale(dpr, dpr);
  g.clearRect(0, 0, W, H);
  g.font = "11px system-ui, sans-serif";
  const muted = css.getPropertyValue("--muted").trim() || "#6b7385";
  g.fillStyle = muted; g.strokeStyle = css.getPropertyValue("--line").trim() || "#dfe3ea";
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
    g.fillStyle = muted;
    g.fillText(String(i + 1), x + slot * 0.35 - 3, H - 6);
    if (slot >= 26) g.fillText(`${Math.round(100 * r)}`, x + slot * 0.35 - 6, H - pad.b - h - 3);
  });
}

// ------------------------------------------------------------------ a turn

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

class HttpError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

function failure(e) {
  if (e instanceof HttpError && e.status === 429)
    return `The server is busy (429): ${e.message}. Your message is back in the box; send it again in a moment.`;
  if (e instanceof HttpError && e.status === 401) {
    $("key-label").hidden = false;
    return `The server wants an API key (401): ${e.message}. Enter it above and send again.`;
  }
  if (e instanceof HttpError) return `The server answered ${e.status}: ${e.message}`;
  return `The reply failed: ${e.message}`;
}

async function send(text) {
  const chat = current();
  const user = { role: "user", content: text };
  chat.messages.push(user);
  if (chat.title === "New chat") chat.title = text.replace(/\s+/g, " ").slice(0, 48);
  chat.draft = $("drafter").value || null;
  save(); showChats();
  const userDiv = showMessage(user);
  const reply = { role: "assistant", content: "", marks: [] };
  const div = addMessage("assistant"), out = div.querySelector(".text");
  scrollDown(true);
  controller = new AbortController();
  $("send").disabled = true; $("stop").disabled = false;
  let draftTokens = 0, t0 = null, frame = 0, lost = false;
  const paint = () => { frame = 0; Render.render(out, reply.content, reply.marks); scrollDown(false); };
  const body = {
    model: "mlx-spec", stream: true, stream_options: { include_usage: true },
    messages: chat.messages.map(({ role, content }) => ({ role, content })),
    max_tokens: Number($("max-tokens").value) || undefined, temperature: Number($("temperature").value),
  };
  if (server.switchable && chat.draft) body.draft = chat.draft;
  try {
    let resp;
    try {
      resp = await fetch("/v1/chat/completions", { method: "POST", headers: headers(), signal: controller.signal,
                                                    body: JSON.stringify(body) });
    } catch (e) { if (e.name !== "AbortError") lost = true; throw e; }
    if (!resp.ok) throw new HttpError(resp.status, await errorText(resp));
    try {
      for await (const data of sse(resp.body)) {
        if (data === "[DONE]") break;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new HttpError(chunk.error.code || 500, chunk.error.message);
        const extra = chunk.mlx_spec;
        if (!extra) continue;
        if (extra.pieces) {
          t0 = t0 ?? performance.now();
          extra.pieces.forEach((piece, i) => {
            reply.content += piece;
            reply.marks.push([piece.length, extra.pos ? extra.pos[i] : (extra.draft[i] ? 1 : 0),
                              extra.round ? extra.round[i] : 0]);
            draftTokens += extra.draft[i] ? 1 : 0;
          });
          showLive(extra, t0, draftTokens);
          if (!frame) frame = requestAnimationFrame(paint);
        } else {
          showFinal(extra);
          const { draft_flags, ...stats } = extra;  // the flags are in reply.marks already
          reply.stats = stats;
          reply.note = `${extra.generation_tokens} tokens · ${extra.tokens_per_second.toFixed(1)} tok/s · ` +
            `${pct(extra.draft_share)} from drafts · finish: ${extra.finish_reason}`;
        }
      }
    } catch (e) { if (e.name !== "AbortError" && !(e instanceof HttpError)) lost = true; throw e; }
    finishReply(chat, reply, div, out, frame);
  } catch (e) {
    const stopped = e.name === "AbortError";
    if (stopped || reply.content) {  // stopped, cut off or failed mid-reply: what came stays
      reply.note = reply.note || (stopped ? "stopped" : lost ? "cut off: the connection was lost" : `failed: ${e.message}`);
      finishReply(chat, reply, div, out, frame);
      if (!stopped && !lost) notice(failure(e), "error");
    } else {  // nothing came: the turn leaves the conversation and its text goes back into the box
      div.remove();
      userDiv.remove();
      chat.messages.splice(chat.messages.indexOf(user), 1);
      if (!$("prompt").value) $("prompt").value = text;
      save();
      if (!lost) notice(failure(e), "error");
    }
    if (lost) reconnect();
  } finally {
    controller = null;
    $("send").disabled = false; $("stop").disabled = true;
  }
}

function finishReply(chat, reply, div, out, frame) {
  if (frame) cancelAnimationFrame(frame);
  Render.render(out, reply.content, reply.marks);
  if (reply.note) finishNote(div, reply.note);
  if (state.chats.includes(chat)) chat.messages.push(reply);  // unless the chat was deleted meanwhile
  save();
  scrollDown(false);
}

// ------------------------------------------------------------------ wiring

$("form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const text = $("prompt").value.trim();
  if (!text || controller) return;
  $("prompt").value = "";
  send(text);
});
$("prompt").addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) { ev.preventDefault(); $("form").requestSubmit(); }
});
document.addEventListener("keydown", (ev) => {
  if (ev.key !== "Escape") return;
  if (controller) { ev.preventDefault(); controller.abort(); }
  document.body.classList.remove("nav-open");
});
$("stop").addEventListener("click", () => controller && controller.abort());
$("new-chat").addEventListener("click", newChat);
$("menu").addEventListener("click", () => {
  const open = document.body.classList.toggle("nav-open");
  $("menu").setAttribute("aria-expanded", String(open));
});
$("drafter").addEventListener("change", () => { current().draft = $("drafter").value; save(); showK(); });
$("overlay").addEventListener("change", () => {
  document.body.classList.toggle("overlay", $("overlay").checked);
  localStorage.setItem(OVERLAY, $("overlay").checked ? "on" : "off");
});
$("api-key").addEventListener("change", () => { localStorage.setItem(KEY, $("api-key").value); loadPair(); });
window.matchMedia("(prefers-color-scheme: dark)").addEventListener("change", () => drawChart([]));

$("overlay").checked = localStorage.getItem(OVERLAY) === "on";
document.body.classList.toggle("overlay", $("overlay").checked);
drawChart([]);
current();
showChats();
showLog();
loadPair();
