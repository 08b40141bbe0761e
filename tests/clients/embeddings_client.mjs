// kiln serve's POST /v1/embeddings through the official `openai` npm package.
//   node embeddings_client.mjs BASE_URL TEXTS_JSON
// BASE_URL is http://127.0.0.1:PORT/v1 of a server on an embedding model; TEXTS_JSON a JSON
// list of texts. The package asks for base64 unless told otherwise and decodes it: both ways
// must give the same vectors. Prints one JSON object (the vectors, the usage) for the
// caller (tests/client_test.cpp) to compare with kiln embed's. Exits non-zero on a failed check.
import assert from "node:assert/strict";
import OpenAI from "openai";

const [baseURL, textsJson] = process.argv.slice(2);
const texts = JSON.parse(textsJson);
const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0, timeout: 60_000 });
const model = (await client.models.list()).data[0].id;

const decoded = await client.embeddings.create({ model, input: texts });  // base64 on the wire
assert.equal(decoded.object, "list");
assert.equal(decoded.data.length, texts.length);
decoded.data.forEach((d, i) => {
  assert.equal(d.object, "embedding");
  assert.equal(d.index, i);
  const norm = Math.sqrt(d.embedding.reduce((s, x) => s + x * x, 0));
  assert.ok(Math.abs(norm - 1) < 1e-5, `vector ${i} has norm ${norm}`);
});
assert.ok(decoded.usage.prompt_tokens > 0);
assert.equal(decoded.usage.total_tokens, decoded.usage.prompt_tokens);

const floats = await client.embeddings.create({ model, input: texts, encoding_format: "float" });
assert.deepEqual(floats.data.map((d) => Array.from(d.embedding)), decoded.data.map((d) => Array.from(d.embedding)));
const one = await client.embeddings.create({ model, input: texts[0], encoding_format: "float" });
assert.deepEqual(Array.from(one.data[0].embedding), Array.from(floats.data[0].embedding));

// Typed errors: a bad input is a 400 naming it; an encoder does not complete (501).
await assert.rejects(client.embeddings.create({ model, input: [] }), (e) => {
  assert.ok(e instanceof OpenAI.BadRequestError, String(e));
  assert.equal(e.param, "input");
  return true;
});
await assert.rejects(client.completions.create({ model, prompt: "hi", max_tokens: 4 }), (e) => {
  assert.equal(e.status, 501);
  return true;
});

console.log(JSON.stringify({ model, embeddings: decoded.data.map((d) => Array.from(d.embedding)), usage: decoded.usage }));
