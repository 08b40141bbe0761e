// kiln serve through the official `openai` npm package, as programs use it.
//   node openai_client.mjs BASE_URL API_KEY
// BASE_URL is http://127.0.0.1:PORT/v1 of a server started with --api-key API_KEY.
// Checks here what the package itself sees (parsed objects, streamed deltas, typed errors);
// prints one JSON object of the texts for the caller (tests/client_test.cpp) to compare
// with kiln run's. Exits non-zero on the first failed check.
import assert from "node:assert/strict";
import OpenAI from "openai";

const [baseURL, apiKey] = process.argv.slice(2);
// No retries: a 5xx must show up here, not be retried away.
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60_000 });

const models = await client.models.list();
assert.equal(models.data.length, 1);
const model = models.data[0].id;
assert.equal(models.data[0].object, "model");

// /v1/completions, whole and streamed: the same greedy text.
const prompt = "Once upon a time";
const completion = await client.completions.create({ model, prompt, max_tokens: 24, temperature: 0 });
assert.equal(completion.object, "text_completion");
assert.equal(completion.choices.length, 1);
const text = completion.choices[0].text;
assert.ok(text.length > 0, "empty completion");
assert.ok(["stop", "length"].includes(completion.choices[0].finish_reason));
assert.ok(completion.usage.prompt_tokens > 0);
assert.equal(completion.usage.total_tokens, completion.usage.prompt_tokens + completion.usage.completion_tokens);

let streamedText = "";
let sawFinish = null;
const completionStream = await client.completions.create({ model, prompt, max_tokens: 24, temperature: 0, stream: true });
for await (const chunk of completionStream) {
  for (const choice of chunk.choices) {
    streamedText += choice.text;
    if (choice.finish_reason) sawFinish = choice.finish_reason;
  }
}
assert.equal(streamedText, text);
assert.equal(sawFinish, completion.choices[0].finish_reason);

// /v1/chat/completions, whole and streamed with usage in the last chunk.
const messages = [
  { role: "system", content: "You tell short stories." },
  { role: "user", content: "Tell me about a cat." },
];
const chat = await client.chat.completions.create({ model, messages, max_completion_tokens: 20, temperature: 0 });
assert.equal(chat.object, "chat.completion");
assert.equal(chat.choices[0].message.role, "assistant");
const reply = chat.choices[0].message.content;
assert.equal(typeof reply, "string");
assert.ok(chat.usage.prompt_tokens > 0);

let streamedReply = "";
let streamUsage = null;
let chunks = 0;
const chatStream = await client.chat.completions.create({
  model, messages, max_completion_tokens: 20, temperature: 0, stream: true,
  stream_options: { include_usage: true },
});
for await (const chunk of chatStream) {
  assert.equal(chunk.object, "chat.completion.chunk");
  chunks++;
  if (chunk.usage) streamUsage = chunk.usage;
  for (const choice of chunk.choices) streamedReply += choice.delta.content ?? "";
}
assert.equal(streamedReply, reply);
assert.ok(chunks > 2, `only ${chunks} chunks`);
assert.ok(streamUsage, "no usage chunk with include_usage");
assert.equal(streamUsage.completion_tokens, chat.usage.completion_tokens);
assert.equal(streamUsage.prompt_tokens, chat.usage.prompt_tokens);
// The second identical prompt found the first one's blocks in the prefix cache.
assert.ok(streamUsage.prompt_tokens_details.cached_tokens > 0, "no cached tokens on a repeated prompt");

// Errors arrive as the package's typed errors, with the field named.
await assert.rejects(
  client.completions.create({ model, prompt, max_tokens: -1 }),
  (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && /max_tokens/.test(e.message));
await assert.rejects(
  client.chat.completions.create({ model, messages: [{ role: "wizard", content: "hi" }] }),
  (e) => e instanceof OpenAI.BadRequestError && /role/.test(e.message));
const wrongKey = new OpenAI({ baseURL, apiKey: apiKey + "-wrong", maxRetries: 0 });
await assert.rejects(wrongKey.models.list(), (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);

// A stream the client aborts: the package stops reading, the server goes on serving others.
// (ignore_eos, llama-server's extension, passes through the package as an extra field: the
// story would otherwise end before the abort.)
const controller = new AbortController();
const aborted = await client.completions.create(
  { model, prompt, max_tokens: 2000, stream: true, ignore_eos: true }, { signal: controller.signal });
let abortedChunks = 0;
// The package ends the iteration quietly on its own abort, after the chunks it already had.
for await (const _ of aborted) {
  if (++abortedChunks === 3) controller.abort();
}
assert.ok(abortedChunks < 2000, "the aborted stream ran to its end");
// The server saw the hang-up and cancelled the request (within a step; polled up to 10 s).
const metricsUrl = baseURL.replace(/\/v1$/, "/metrics");
let cancelled = 0;
for (let i = 0; i < 100 && cancelled < 1; i++) {
  const res = await fetch(metricsUrl, { headers: { Authorization: `Bearer ${apiKey}` } });
  cancelled = Number((await res.text()).match(/^kiln:requests_cancelled_total (\S+)$/m)?.[1] ?? 0);
  if (cancelled < 1) await new Promise((r) => setTimeout(r, 100));
}
assert.ok(cancelled >= 1, "the aborted stream was not cancelled");
const after = await client.completions.create({ model, prompt, max_tokens: 24, temperature: 0 });
assert.equal(after.choices[0].text, text);

console.log(JSON.stringify({ model, completion: text, chat: reply }));
