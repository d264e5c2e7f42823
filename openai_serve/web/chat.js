// The chat page of openai-serve: plain JavaScript, no build step, nothing loaded from elsewhere.
// It is a client of this server's own API like any other: GET /v1/models, then streamed
// POST /v1/chat/completions, read as server-sent events. Stop aborts the fetch: the server sees the
// connection close and aborts the request, so its KV-cache blocks free within one engine step.
"use strict";

const $ = (id) => document.getElementById(id);

const chat = {
  messages: [],  // the conversation so far, as the API takes it (the system prompt is added per request)
  controller: null,  // the AbortController of the answer being streamed
  sessionId: newSessionId(),  // sent as X-Session-Id: a balancer keeps a conversation on one replica
};

function newSessionId() {
  // crypto.getRandomValues works on plain http too (randomUUID needs a secure context).
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

function headers() {
  const result = { "Content-Type": "application/json", "X-Session-Id": chat.sessionId };
  const key = $("api-key").value.trim();
  if (key) result.Authorization = `Bearer ${key}`;
  return result;
}

function setStatus(text) {
  $("status").textContent = text;
}

async function loadModels() {
  let response;
  try {
    response = await fetch("/v1/models", { headers: headers() });
  } catch (error) {
    setStatus(`The server cannot be reached: ${error.message}`);
    return;
  }
  if (response.status === 401) {
    $("api-key-row").hidden = false;
    setStatus($("api-key").value ? "That API key was refused." : "This server needs an API key.");
    return;
  }
  if (!response.ok) {
    setStatus(await errorMessage(response));
    return;
  }
  const select = $("model");
  const chosen = select.value;
  select.replaceChildren(...(await response.json()).data.map((model) => new Option(model.id, model.id)));
  if (chosen) select.value = chosen;
  setStatus("");
}

async function errorMessage(response) {
  try {
    return (await response.json()).error.message;
  } catch {
    return `${response.status} ${response.statusText}`;
  }
}

function addMessage(role, text) {
  const element = document.createElement("div");
  element.className = `message ${role}`;
  element.textContent = text;
  $("messages").append(element);
  element.scrollIntoView({ block: "end" });
  return element;
}

function addNote(element, text) {
  const note = document.createElement("span");
  note.className = "note";
  note.textContent = text;
  element.append(note);
}

function requestBody() {
  const system = $("system").value.trim();
  const body = {
    model: $("model").value,
    messages: system ? [{ role: "system", content: system }, ...chat.messages] : chat.messages,
    stream: true,
    stream_options: { include_usage: true },
  };
  const temperature = parseFloat($("temperature").value);
  if (!Number.isNaN(temperature)) body.temperature = temperature;
  const maxTokens = parseInt($("max-tokens").value, 10);
  if (maxTokens > 0) body.max_tokens = maxTokens;
  return body;
}

// Yields the parsed `data:` payloads of a server-sent event stream, until `[DONE]`.
async function* events(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data:")) continue;  // comments (": ping") keep the connection open
        const data = line.slice(5).trim();
        if (data === "[DONE]") return;
        yield JSON.parse(data);
      }
    }
  }
}

// Tokens per second from the first token on, as llama.cpp's page shows it.
class Speed {
  constructor() {
    this.start = performance.now();
    this.firstToken = null;
    this.tokens = 0;
  }

  add(numTokens) {
    if (this.firstToken === null) this.firstToken = performance.now();
    this.tokens += numTokens;
  }

  text(exact) {
    if (this.firstToken === null) return "";
    const seconds = (performance.now() - this.firstToken) / 1000;
    const rate = seconds > 0 && this.tokens > 1 ? ((this.tokens - 1) / seconds).toFixed(1) : "–";
    const ttft = Math.round(this.firstToken - this.start);
    return `${exact ? "" : "~"}${this.tokens} tokens · ${rate} tokens/s · first token ${ttft} ms`;
  }
}

async function send(event) {
  event.preventDefault();
  const text = $("prompt").value.trim();
  if (!text || chat.controller) return;
  $("prompt").value = "";
  chat.messages.push({ role: "user", content: text });
  addMessage("user", text);
  const answer = addMessage("assistant", "");
  const speed = new Speed();
  chat.controller = new AbortController();
  setBusy(true);
  let content = "";
  let stopped = false;
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(), body: JSON.stringify(requestBody()), signal: chat.controller.signal,
    });
    if (!response.ok) throw new Error(await errorMessage(response));
    for await (const chunk of events(response)) {
      if (chunk.error) throw new Error(chunk.error.message);
      const delta = chunk.choices?.[0]?.delta?.content;
      if (delta) {
        content += delta;
        answer.textContent = content;
        speed.add(1);  // one chunk is usually one token; the usage at the end gives the exact count
        answer.scrollIntoView({ block: "end" });
      }
      if (chunk.usage) speed.tokens = chunk.usage.completion_tokens;
      $("speed").textContent = speed.text(Boolean(chunk.usage));
    }
  } catch (error) {
    if (error.name === "AbortError") {
      stopped = true;
    } else {
      answer.classList.add("error");
      answer.textContent = content ? `${content}\n\n${error.message}` : error.message;
    }
  } finally {
    chat.controller = null;
    setBusy(false);
  }
  if (content) chat.messages.push({ role: "assistant", content });
  if (stopped) addNote(answer, "stopped");
}

function setBusy(busy) {
  $("send").disabled = busy;
  $("stop").disabled = !busy;
}

function stop() {
  if (chat.controller) chat.controller.abort();
}

function newChat() {
  stop();
  chat.messages = [];
  chat.sessionId = newSessionId();
  $("messages").replaceChildren();
  $("speed").textContent = "";
}

$("composer").addEventListener("submit", send);
$("stop").addEventListener("click", stop);
$("new-chat").addEventListener("click", newChat);
$("api-key").addEventListener("change", loadModels);
$("prompt").addEventListener("keydown", (event) => {
  if (event.key !== "Enter" || event.shiftKey) return;
  event.preventDefault();
  $("composer").requestSubmit();
});
loadModels();
