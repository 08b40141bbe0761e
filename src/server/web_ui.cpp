#include "server/web_ui.h"

namespace kiln::server {

// Text is put in the page with textContent only (never innerHTML): a reply is the model's
// text, not markup. The API key field is for servers started with --api-key.
const char* web_ui_html() {
  return R"html(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>kiln</title>
<style>
  body { font-family: system-ui, sans-serif; max-width: 50rem; margin: 0 auto; padding: 1rem; }
  #log { white-space: pre-wrap; line-height: 1.4; }
  .msg { margin: 0.6rem 0; padding: 0.5rem 0.7rem; border-radius: 6px; }
  .user { background: #eef; }
  .assistant { background: #f4f4f4; }
  .error { background: #fee; color: #900; }
  .role { font-weight: bold; font-size: 0.8rem; color: #555; }
  textarea { width: 100%; box-sizing: border-box; font: inherit; }
  #settings { font-size: 0.85rem; color: #444; margin: 0.5rem 0; }
  #settings input { width: 5rem; }
</style>
</head>
<body>
<h1>kiln</h1>
<div id="log"></div>
<textarea id="input" rows="3" placeholder="Message (Enter sends, Shift+Enter for a new line)"></textarea>
<div>
  <button id="send">Send</button>
  <button id="stop" disabled>Stop</button>
  <button id="clear">New conversation</button>
</div>
<div id="settings">
  temperature <input id="temperature" type="number" value="0.8" min="0" step="0.1">
  max tokens <input id="max_tokens" type="number" value="256" min="1" step="1">
  API key <input id="api_key" type="password" placeholder="(none)">
</div>
<script>
"use strict";
const log = document.getElementById("log");
const input = document.getElementById("input");
const sendButton = document.getElementById("send");
const stopButton = document.getElementById("stop");
const apiKey = document.getElementById("api_key");
apiKey.value = localStorage.getItem("kiln_api_key") || "";
apiKey.addEventListener("change", () => localStorage.setItem("kiln_api_key", apiKey.value));
let messages = [];
let controller = null;

function addMessage(role, text) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  const label = document.createElement("div");
  label.className = "role";
  label.textContent = role;
  const body = document.createElement("div");
  body.textContent = text;
  div.append(label, body);
  log.append(div);
  div.scrollIntoView({block: "end"});
  return body;
}

function busy(on) {
  sendButton.disabled = on;
  stopButton.disabled = !on;
}

async function send() {
  const text = input.value;
  if (!text.trim() || controller) return;
  input.value = "";
  messages.push({role: "user", content: text});
  addMessage("user", text);
  const out = addMessage("assistant", "");
  let reply = "";
  controller = new AbortController();
  busy(true);
  try {
    const headers = {"Content-Type": "application/json"};
    if (apiKey.value) headers["Authorization"] = "Bearer " + apiKey.value;
    const res = await fetch("/v1/chat/completions", {
      method: "POST", headers, signal: controller.signal,
      body: JSON.stringify({
        messages, stream: true,
        temperature: Number(document.getElementById("temperature").value),
        max_tokens: Number(document.getElementById("max_tokens").value)})
    });
    if (!res.ok) {
      const err = await res.json().catch(() => ({}));
      throw new Error((err.error && err.error.message) || ("HTTP " + res.status));
    }
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, {stream: true});
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        if (!event.startsWith("data: ") || event === "data: [DONE]") continue;
        const chunk = JSON.parse(event.slice(6));
        if (chunk.error) throw new Error(chunk.error.message);
        const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
        if (delta && delta.content) {
          reply += delta.content;
          out.textContent = reply;
          out.scrollIntoView({block: "end"});
        }
      }
    }
  } catch (e) {
    if (e.name !== "AbortError") addMessage("error", String(e.message || e));
  } finally {
    // A stopped reply is kept, as kiln chat keeps it.
    messages.push({role: "assistant", content: reply});
    controller = null;
    busy(false);
    input.focus();
  }
}

input.addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
    e.preventDefault();
    send();
  }
});
sendButton.addEventListener("click", send);
stopButton.addEventListener("click", () => { if (controller) controller.abort(); });
document.getElementById("clear").addEventListener("click", () => {
  if (controller) controller.abort();
  messages = [];
  log.textContent = "";
});
input.focus();
</script>
</body>
</html>
)html";
}

}  // namespace kiln::server
