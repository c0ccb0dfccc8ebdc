// Playground chat: POST /v1/chat/completions with stream: true, read token by token over SSE. The time to first
// token is measured here (request sent -> first content delta); usage comes from the stream's usage chunk.
// With "Keep a KV session" every turn carries X-Session-ID, so the server keeps the conversation's KV cache;
// "New chat" ends that session (DELETE /v1/sessions/{id}).

import { ApiError, request, streamSSE } from "./api.js";
import { $, el, fillSelect } from "./ui.js";

export class Chat {
  constructor() {
    this.messages = [];
    this.controller = null;
    this.sessionId = null;
    this.log = $("#chat-log");
    this.input = $("#chat-input");
    $("#chat-form").addEventListener("submit", (e) => { e.preventDefault(); this.send(); });
    this.input.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); this.send(); }
    });
    $("#chat-stop").addEventListener("click", () => this.controller && this.controller.abort());
    $("#chat-new").addEventListener("click", () => this.reset());
    $("#chat-session").addEventListener("change", () => this.endSession());
    $("#chat-settings").addEventListener("submit", (e) => e.preventDefault());
  }

  setModels(llmNames) { fillSelect($("#chat-model"), llmNames, "no LLM loaded"); }

  async endSession() {
    const id = this.sessionId;
    this.sessionId = null;
    $("#chat-session-id").textContent = "";
    if (id) {
      try { await request(`/v1/sessions/${encodeURIComponent(id)}`, { method: "DELETE" }); } catch { /* already gone */ }
    }
  }

  async reset() {
    if (this.controller) this.controller.abort();
    this.messages = [];
    this.log.replaceChildren(el("p", { class: "muted empty-hint", text: "New conversation." }));
    $("#chat-stats").textContent = "\u00a0";
    await this.endSession();
  }

  nearBottom() { return this.log.scrollHeight - this.log.scrollTop - this.log.clientHeight < 40; }
  scroll(force) { if (force || this.nearBottom()) this.log.scrollTop = this.log.scrollHeight; }

  bubble(role, text) {
    const body = el("span", { class: "text", text });
    const node = el("div", { class: `message ${role}` }, el("span", { class: "who", text: role === "user" ? "You" : role === "assistant" ? $("#chat-model").value : "Error" }), body);
    if (role === "assistant") node.append(el("span", { class: "meta", text: "\u00a0" })); // reserved: no jump when filled
    const hint = this.log.querySelector(".empty-hint");
    if (hint) hint.remove();
    this.log.append(node);
    this.scroll(true);
    return { node, body };
  }

  settings() {
    const body = {
      model: $("#chat-model").value,
      stream: true,
      stream_options: { include_usage: true },
      temperature: Number($("#chat-temperature").value),
      max_tokens: Number($("#chat-max-tokens").value),
    };
    const system = $("#chat-system").value.trim();
    body.messages = [...(system ? [{ role: "system", content: system }] : []), ...this.messages];
    return body;
  }

  async send() {
    const text = this.input.value.trim();
    if (!text || this.controller) return;
    if (!$("#chat-model").value) { this.bubble("error", "No LLM is loaded."); return; }
    this.input.value = "";
    this.messages.push({ role: "user", content: text });
    this.bubble("user", text);
    const answer = this.bubble("assistant", "");
    answer.node.classList.add("streaming");
    answer.node.setAttribute("aria-busy", "true");
    const headers = {};
    if ($("#chat-session").checked) {
      this.sessionId = this.sessionId || `console-${crypto.randomUUID()}`;
      headers["X-Session-ID"] = this.sessionId;
      $("#chat-session-id").textContent = `Session ${this.sessionId}`;
    }
    const stats = $("#chat-stats");
    stats.textContent = "Waiting for the first token…";
    this.controller = new AbortController();
    $("#chat-send").disabled = true;
    $("#chat-stop").disabled = false;
    const started = performance.now();
    let first = null, content = "", usage = null, finish = null;
    try {
      await streamSSE("/v1/chat/completions", this.settings(), (chunk) => {
        if (chunk.usage) usage = chunk.usage;
        const choice = chunk.choices && chunk.choices[0];
        if (!choice) return;
        if (choice.finish_reason) finish = choice.finish_reason;
        const piece = choice.delta && choice.delta.content;
        if (piece) {
          if (first === null) { first = performance.now(); stats.textContent = `TTFT ${Math.round(first - started)} ms · streaming…`; }
          content += piece;
          answer.body.textContent = content;
          this.scroll(false);
        }
      }, { signal: this.controller.signal, headers });
      this.messages.push({ role: "assistant", content });
      stats.textContent = this.summary(started, first, performance.now(), usage, finish);
      answer.node.querySelector(".meta").textContent = stats.textContent;
    } catch (err) {
      const aborted = err.name === "AbortError";
      if (content) this.messages.push({ role: "assistant", content });
      else this.messages.pop(); // keep the history consistent: the unanswered question goes
      if (aborted) stats.textContent = "Stopped.";
      else {
        stats.textContent = "\u00a0";
        this.bubble("error", err instanceof ApiError ? `${err.status}: ${err.message}` : String(err.message || err));
      }
    } finally {
      answer.node.classList.remove("streaming");
      answer.node.removeAttribute("aria-busy");
      this.controller = null;
      $("#chat-send").disabled = false;
      $("#chat-stop").disabled = true;
    }
  }

  summary(started, first, ended, usage, finish) {
    const parts = [];
    if (first !== null) parts.push(`TTFT ${Math.round(first - started)} ms`);
    if (usage) {
      parts.push(`${usage.prompt_tokens} prompt + ${usage.completion_tokens} completion tokens`);
      const cached = usage.prompt_tokens_details && usage.prompt_tokens_details.cached_tokens;
      if (cached) parts.push(`${cached} cached`);
      if (first !== null && usage.completion_tokens > 1 && ended > first) {
        parts.push(`${((usage.completion_tokens - 1) / ((ended - first) / 1000)).toFixed(1)} tok/s`);
      }
    }
    if (finish) parts.push(`finish: ${finish}`);
    return parts.join(" · ") || "\u00a0";
  }
}
