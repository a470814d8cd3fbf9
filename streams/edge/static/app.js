// specstream chat page: streams answers over the edge's websocket (/v1/ws).
//
// Protocol (see the edge's /openapi.json description): after the socket opens we send
// {"type": "auth", "api_key": KEY} (browsers cannot set an Authorization header on a
// websocket); the edge answers {"type": "auth", "ok": true, "tenant": ...} or closes the
// socket with code 1008. A request is the chat body plus an "id"; the edge replies with
// "chunk" frames ({text, token_ids, spec: {drafted, accepted}, draft_chars}), then one
// "done" frame ({text, finish_reason, usage, timings, spec}) or an "error" frame.
//
// Each chunk is one engine step: its first spec.accepted tokens were drafted and accepted,
// the last one the target model produced. draft_chars says how many leading characters of
// the chunk's text came from those accepted drafts; they are shown highlighted.
"use strict";

const KEY_STORAGE = "specstream.apiKey";
const $ = (id) => document.getElementById(id);

const ui = {
  model: $("model"), key: $("api-key"), connect: $("connect"), status: $("status"), log: $("log"),
  form: $("composer"), prompt: $("prompt"), send: $("send"), stop: $("stop"), clear: $("clear"),
  maxTokens: $("max-tokens"), temperature: $("temperature"),
  tps: $("tps"), acceptance: $("acceptance"), drafts: $("drafts"), tokens: $("tokens"), ttft: $("ttft"),
};

const state = {
  ws: null,
  authed: false,
  history: [],   // the conversation: [{role, content}]
  current: null, // the answer being streamed
  nextId: 1,
};

function setStatus(text, kind) {
  ui.status.textContent = text;
  ui.status.className = kind || "";
}

function wsUrl() {
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  return `${scheme}//${location.host}/v1/ws`;
}

async function loadModels() {
  const key = ui.key.value.trim();
  try {
    const response = await fetch("/v1/models", { headers: key ? { Authorization: `Bearer ${key}` } : {} });
    const body = await response.json();
    if (!response.ok) throw new Error(body.error ? body.error.message : response.statusText);
    const previous = ui.model.value;
    ui.model.replaceChildren(...body.data.map((m) => new Option(m.id, m.id)));
    if (previous && body.data.some((m) => m.id === previous)) ui.model.value = previous;
  } catch (error) {
    // Without a key both this call and the websocket fail; the websocket's "rejected" says why, keep it.
    if (!ui.status.textContent.includes("rejected")) setStatus(`models: ${error.message}`, "bad");
  }
}

function connect() {
  if (state.ws) state.ws.close();
  const key = ui.key.value.trim();
  localStorage.setItem(KEY_STORAGE, key);
  state.authed = false;
  setStatus("connecting ...");
  const ws = new WebSocket(wsUrl(), ["specstream.v1"]);
  state.ws = ws;
  ws.onopen = () => ws.send(JSON.stringify({ type: "auth", api_key: key }));
  ws.onmessage = (event) => onFrame(JSON.parse(event.data));
  ws.onclose = (event) => {
    if (state.ws !== ws) return;
    state.ws = null;
    state.authed = false;
    const why = event.code === 1008 ? `API key rejected (${event.reason || "policy violation"})`
      : event.code === 1009 ? "message too large" : `disconnected (code ${event.code})`;
    setStatus(why, "bad");
    if (state.current) finishAnswer({ error: why });
  };
  loadModels();
}

function onFrame(frame) {
  const answer = state.current;
  switch (frame.type) {
    case "auth":
      state.authed = true;
      setStatus(`connected as tenant ${frame.tenant}`, "ok");
      return;
    case "chunk":
      if (answer && frame.id === answer.id) addChunk(answer, frame);
      return;
    case "done":
      if (answer && frame.id === answer.id) finishAnswer({ done: frame });
      return;
    case "error":
      if (answer && (frame.id === answer.id || frame.id === null)) {
        const retry = frame.retry_after ? ` (retry in ${frame.retry_after} s)` : "";
        finishAnswer({ error: `${frame.status} ${frame.code}: ${frame.message}${retry}` });
      } else {
        setStatus(`${frame.code}: ${frame.message}`, "bad");
      }
      return;
  }
}

function addMessage(role, text) {
  const el = document.createElement("div");
  el.className = `msg ${role}`;
  const body = document.createElement("span");
  body.className = "text";
  body.textContent = text;
  el.append(body);
  ui.log.append(el);
  ui.log.scrollTop = ui.log.scrollHeight;
  return el;
}

function addChunk(answer, frame) {
  const now = performance.now();
  if (answer.firstAt === null) {
    answer.firstAt = now;
    answer.firstTokens = frame.token_ids.length;
    ui.ttft.textContent = `${Math.round(now - answer.sentAt)} ms`;
  }
  answer.lastAt = now;
  answer.tokens += frame.token_ids.length;
  answer.drafted += frame.spec.drafted;
  answer.accepted += frame.spec.accepted;
  answer.text += frame.text;
  const split = Math.max(0, Math.min(frame.draft_chars || 0, frame.text.length));
  if (split > 0) answer.body.append(span("draft", frame.text.slice(0, split)));
  if (split < frame.text.length) answer.body.append(span("target", frame.text.slice(split)));
  ui.log.scrollTop = ui.log.scrollHeight;
  showStats(answer);
}

function span(kind, text) {
  const el = document.createElement("span");
  el.className = kind;
  el.textContent = text;
  return el;
}

function showStats(answer, final) {
  // Decode speed: tokens after the first chunk over the time since it (the first chunk waits for the prompt).
  const elapsed = (answer.lastAt - answer.firstAt) / 1000;
  const rate = elapsed > 0 ? (answer.tokens - answer.firstTokens) / elapsed : null;
  ui.tps.textContent = rate === null ? "–" : rate.toFixed(1);
  const acceptance = final ? final.spec.acceptance_rate : answer.drafted > 0 ? answer.accepted / answer.drafted : null;
  const drafted = final ? final.spec.drafted : answer.drafted;
  ui.acceptance.textContent = acceptance === null || drafted === 0 ? "0% (no drafts)" : `${(acceptance * 100).toFixed(0)}%`;
  ui.drafts.textContent = `${drafted} / ${final ? final.spec.accepted : answer.accepted}`;
  ui.tokens.textContent = String(final ? final.usage.completion_tokens : answer.tokens);
}

function finishAnswer({ done, error }) {
  const answer = state.current;
  if (!answer) return;
  state.current = null;
  ui.send.disabled = false;
  ui.stop.disabled = true;
  const meta = document.createElement("span");
  meta.className = "meta";
  if (done) {
    state.history.push({ role: "assistant", content: done.text });
    if (answer.firstAt !== null) showStats(answer, done);
    const t = done.timings;
    meta.textContent = `${done.usage.completion_tokens} tokens · ${done.finish_reason} · ` +
      `first token ${(t.ttft_s * 1000).toFixed(0)} ms · total ${t.total_s.toFixed(2)} s · ` +
      `${done.spec.tokens_per_forward.toFixed(2)} tokens per target forward`;
  } else {
    state.history.pop(); // the question that got no answer
    meta.textContent = error;
    meta.classList.add("error");
  }
  answer.el.append(meta);
  answer.el.dataset.state = done ? "done" : "error";
}

function send(event) {
  event.preventDefault();
  const text = ui.prompt.value.trim();
  if (!text || state.current) return;
  if (!state.ws || state.ws.readyState !== WebSocket.OPEN || !state.authed) {
    setStatus("not connected: enter the API key and press Connect", "bad");
    return;
  }
  ui.prompt.value = "";
  addMessage("user", text);
  state.history.push({ role: "user", content: text });
  const el = addMessage("assistant", "");
  el.dataset.state = "streaming";
  const answer = {
    id: `page-${state.nextId++}`, el, body: el.querySelector(".text"), text: "", sentAt: performance.now(),
    firstAt: null, lastAt: null, firstTokens: 0, tokens: 0, drafted: 0, accepted: 0,
  };
  state.current = answer;
  ui.send.disabled = true;
  ui.stop.disabled = false;
  for (const el of [ui.tps, ui.acceptance, ui.drafts, ui.tokens, ui.ttft]) el.textContent = "–";
  const request = {
    type: "request", id: answer.id, model: ui.model.value, messages: state.history,
    max_tokens: Number(ui.maxTokens.value) || 256, temperature: Number(ui.temperature.value) || 0,
  };
  state.ws.send(JSON.stringify(request));
}

ui.form.addEventListener("submit", send);
ui.prompt.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey) send(event);
});
ui.stop.addEventListener("click", () => {
  if (state.current && state.ws) state.ws.send(JSON.stringify({ type: "cancel", id: state.current.id }));
});
ui.clear.addEventListener("click", () => {
  state.history = [];
  ui.log.replaceChildren();
});
ui.connect.addEventListener("click", connect);
ui.key.addEventListener("keydown", (event) => {
  if (event.key === "Enter") connect();
});

ui.key.value = localStorage.getItem(KEY_STORAGE) || "";
connect();
