// The policy playground in a real browser: the page loads the wasm module
// (the real parser and model), shows a document's error with its path and
// line:column as it is typed, and a known document and pattern give the
// known decisions on the page.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync } from "node:fs";
import { join, resolve } from "node:path";
import { serve, launch } from "./browser.mjs";

const SITE = process.env.SLUICE_PLAYGROUND || resolve(import.meta.dirname, "../../dist/playground");
let server, browser, page;

before(async () => {
  server = await serve(SITE);
  browser = await launch();
  page = await browser.newPage();
  const errors = [];
  page.on("pageerror", (e) => errors.push(e));
  await page.goto(server.url);
  await page.waitForSelector("body[data-ready=true]", { timeout: 20000 });
  assert.deepEqual(errors, []);
});

after(async () => {
  await browser?.close();
  server?.close();
});

test("the default document is valid", async () => {
  assert.match(await page.textContent("#validity"), /^valid: 1 policies \(partner-api\)$/);
});

test("an error shows its JSON path and line:column as you type", async () => {
  await page.fill("#document", '{"policies": [{"name": "a",\n "limits": [{"type": "sliding_window", "limit": 0, "window": "5s"}]}]}');
  const text = await page.textContent("#validity");
  assert.equal(await page.getAttribute("#validity", "class"), "status error");
  assert.match(text, /policies\[0\]\.limits\[0\]/);
  assert.match(text, / at 2:\d+$/);
});

test("a known document and pattern give the known decisions", async () => {
  await page.fill(
    "#document",
    JSON.stringify({
      policies: [{ name: "api", key: ["header:x-user"], limits: [{ type: "fixed_window", limit: 3, window: "1m" }] }],
    }),
  );
  await page.fill(
    "#pattern",
    JSON.stringify({
      streams: [
        { headers: { "x-user": "ann" }, burst: 5, at: "1s" },
        { headers: { "x-user": "bob" }, every: "500ms", until: "2s" },
      ],
    }),
  );
  await page.click("#run");
  const rows = await page.$$eval("#timeline tbody tr", (trs) =>
    trs.map((tr) => [...tr.cells].map((td) => td.textContent)),
  );
  // Three per minute each: bob at 0 and 500 ms; at 1 s ann's burst (stream 0
  // goes first at a tie): 3 admitted, 2 denied; then bob's third; bob at 1.5 s denied.
  const seen = rows.map((r) => [r[1], r[3], r[4], r[5]]);
  assert.deepEqual(seen, [
    ["0.0 ms", "admitted", "api / bob", "2"],
    ["500.0 ms", "admitted", "api / bob", "1"],
    ["1000.0 ms", "admitted", "api / ann", "2"],
    ["1000.0 ms", "admitted", "api / ann", "1"],
    ["1000.0 ms", "admitted", "api / ann", "0"],
    ["1000.0 ms", "denied", "api / ann", "0"],
    ["1000.0 ms", "denied", "api / ann", "0"],
    ["1000.0 ms", "admitted", "api / bob", "0"],
    ["1500.0 ms", "denied", "api / bob", "0"],
  ]);
  assert.equal(await page.textContent("#summary"), "9 requests: 6 admitted, 3 denied");
  assert.equal(await page.locator("#chart circle.denied").count(), 3);
  if (process.env.SLUICE_SCREENSHOTS) {
    mkdirSync(process.env.SLUICE_SCREENSHOTS, { recursive: true });
    await page.screenshot({ path: join(process.env.SLUICE_SCREENSHOTS, "playground.png"), fullPage: true });
  }
});
