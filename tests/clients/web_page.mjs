// The chat page at / in a real headless Chromium (Debian's, driven by playwright-core), used
// as a person would: type, Enter sends, Shift+Enter is a new line, the reply streams in.
//   node web_page.mjs BASE_URL [CHROMIUM]
// BASE_URL is http://127.0.0.1:PORT of a kiln serve without --api-key. Prints one JSON
// object (the replies the page showed, the requests it sent) for tests/client_test.cpp to
// compare with the server's own answers; exits non-zero on the first failed check.
import assert from "node:assert/strict";
import { chromium } from "playwright-core";

const [baseURL, executablePath = "/usr/bin/chromium"] = process.argv.slice(2);
const browser = await chromium.launch({ executablePath, headless: true, args: ["--no-sandbox"] });
try {
  const page = await browser.newPage();
  const pageErrors = [];
  page.on("pageerror", (e) => pageErrors.push(String(e)));
  // Every chat request the page sends, and whether its answer came as an event stream.
  const requests = [];
  page.on("response", async (res) => {
    if (!res.url().endsWith("/v1/chat/completions")) return;
    requests.push({ body: JSON.parse(res.request().postData()), contentType: res.headers()["content-type"] });
  });
  // The page has no third-party resources: nothing may leave 127.0.0.1.
  const foreign = [];
  page.on("request", (req) => { if (!req.url().startsWith(baseURL)) foreign.push(req.url()); });

  await page.goto(baseURL + "/");
  await page.fill("#temperature", "0");
  await page.fill("#max_tokens", "24");

  const assistantReplies = () => page.$$eval(".msg.assistant > div:last-child", (ds) => ds.map((d) => d.textContent));
  const waitForReplies = async (n) => {
    // The send button comes back when the stream has ended.
    await page.waitForFunction((n) => document.querySelectorAll(".msg.assistant").length === n &&
      !document.getElementById("send").disabled, n, { timeout: 30_000 });
    return assistantReplies();
  };

  // Shift+Enter is a new line in the box; Enter sends both lines as one message.
  await page.click("#input");
  await page.keyboard.type("Tell me a story");
  await page.keyboard.press("Shift+Enter");
  await page.keyboard.type("about a dog.");
  assert.equal(await page.$$eval(".msg.user", (ds) => ds.length), 0, "Shift+Enter sent the message");
  assert.equal(await page.inputValue("#input"), "Tell me a story\nabout a dog.");
  await page.keyboard.press("Enter");
  const first = await waitForReplies(1);
  assert.equal(await page.inputValue("#input"), "", "the box was not cleared");
  assert.ok(first[0].length > 0, "no reply shown");

  // A second turn carries the first one in messages[].
  await page.fill("#input", "And then?");
  await page.press("#input", "Enter");
  const both = await waitForReplies(2);

  const users = await page.$$eval(".msg.user > div:last-child", (ds) => ds.map((d) => d.textContent));
  assert.deepEqual(users, ["Tell me a story\nabout a dog.", "And then?"]);
  assert.equal(requests.length, 2);
  for (const r of requests) {
    assert.equal(r.body.stream, true);
    assert.match(r.contentType, /^text\/event-stream/);
  }
  assert.deepEqual(requests[1].body.messages.map((m) => m.role), ["user", "assistant", "user"]);
  assert.equal(requests[1].body.messages[1].content, first[0]);
  assert.deepEqual(pageErrors, []);
  assert.deepEqual(foreign, []);
  console.log(JSON.stringify({ replies: both, requests: requests.map((r) => r.body) }));
} finally {
  await browser.close();
}
