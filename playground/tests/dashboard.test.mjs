// The Limits dashboard in a real browser: the real shim (dist/sluice) in
// front of a real redis-server, given a policy document. The test sends
// checks to the shim the way the filter does (POST /v1/check) until the
// page shows them: the document's policies, a busy key with its state,
// a non-zero allowed rate. It never judges timing: traffic goes on until
// the page shows it, within a generous deadline. A report of failure-mode
// passes (POST /v1/report, as the filter's worker sends it) and held
// egress checks then show in each policy's chart of the last minutes. It
// also opens the playground the shim serves at /playground/.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, writeFileSync, mkdirSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { launch } from "./browser.mjs";

const ROOT = resolve(import.meta.dirname, "../..");
const DIST = process.env.SLUICE_DIST || join(ROOT, "dist");
const REDIS = process.env.SLUICE_REDIS_SERVER || "redis-server";
const SITE = process.env.SLUICE_PLAYGROUND || join(DIST, "playground");
const DEADLINE_MS = 30000;

const DOCUMENT = {
  policies: [
    {
      name: "partner-api",
      key: ["header:x-api-key"],
      limits: [
        { type: "sliding_window", limit: 25, window: "5s" },
        { type: "sliding_window", limit: 300, window: "1m" },
      ],
    },
    { name: "erp", key: ["header:x-tenant"], limits: [{ type: "concurrency", limit: 4, lease: "1m" }] },
    { name: "search", limits: [{ type: "token_bucket", rate: 10, per: "1s", burst: 20 }] },
    { name: "reports", key: ["header:x-user"], limits: [{ type: "fixed_window", limit: 100, window: "1h" }] },
    { name: "egress", wait: { timeout: "3s" }, limits: [{ type: "interval", every: "500ms" }] },
  ],
};
// Each check as the filter would send it for DOCUMENT.
const LIMITS = {
  "partner-api": [
    { type: "sliding_window", limit: 25, window_ms: 5000 },
    { type: "sliding_window", limit: 300, window_ms: 60000 },
  ],
  erp: [{ type: "concurrency", limit: 4, lease_ms: 60000 }],
  search: [{ type: "token_bucket", rate: 10, per_ms: 1000, burst: 20 }],
  egress: [{ type: "interval", every_ms: 500 }],
};
// The filter sends a policy with `wait` its timeout with each check.
const WAIT_MS = { egress: 3000 };

let children = [], browser, shim, traffic, sent = 0;

function freePort() {
  return new Promise((done, fail) => {
    const server = createServer().listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => done(port));
    });
    server.on("error", fail);
  });
}

function start(cmd, args) {
  const child = spawn(cmd, args, { stdio: ["ignore", "ignore", "inherit"] });
  children.push(child);
  return child;
}

async function until(what, probe) {
  const end = Date.now() + DEADLINE_MS;
  for (;;) {
    try {
      if (await probe()) return;
    } catch {}
    if (Date.now() > end) throw new Error(`gave up waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

let id = 0;
function check(policy, key) {
  const body = { id: `t${++id}`, checks: [{ policy, key, limits: LIMITS[policy] }], wait_ms: WAIT_MS[policy] };
  sent++;
  return fetch(`${shim}/v1/check`, { method: "POST", body: JSON.stringify(body) }).catch(() => {});
}

before(async () => {
  const dir = mkdtempSync(join(tmpdir(), "sluice-dashboard-"));
  writeFileSync(join(dir, "policy.json"), JSON.stringify(DOCUMENT));
  const [redisPort, shimPort] = [await freePort(), await freePort()];
  start(REDIS, ["--port", `${redisPort}`, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]);
  start(join(DIST, "sluice"), [
    "serve", "--listen", `127.0.0.1:${shimPort}`, "--redis", `redis://127.0.0.1:${redisPort}`,
    "--policy", join(dir, "policy.json"), "--playground", SITE,
  ]);
  shim = `http://127.0.0.1:${shimPort}`;
  await until("the shim", async () => (await fetch(`${shim}/healthz`)).ok);
  // Steady traffic, as gateways would send it, until the tests end: alice
  // busiest, then bob; erp's leases are never released, so it fills up.
  traffic = setInterval(() => {
    check("partner-api", "alice");
    check("partner-api", "alice");
    check("partner-api", "bob");
    if (id % 5 === 0) check("erp", "acme");
    check("search", "");
    // Four a second for two a second: held, then refused once the wait is too long.
    if (id % 3 === 0) check("egress", "");
  }, 100);
  browser = await launch();
});

after(async () => {
  clearInterval(traffic);
  await browser?.close();
  for (const child of children) child.kill();
});

test("the dashboard shows the policies, a busy key with its state from Redis, and the traffic", async () => {
  const page = await browser.newPage({ viewport: { width: 1100, height: 900 } });
  const errors = [];
  page.on("pageerror", (e) => errors.push(e));
  await page.goto(`${shim}/`);
  const partner = 'section[data-policy="partner-api"]';
  await page.waitForFunction(
    (sel) => {
      const rate = document.querySelector(`${sel} [data-rate="allowed"] b`);
      const erp = document.querySelector('section[data-policy="erp"] tr[data-key="acme"]');
      return rate && parseFloat(rate.textContent) > 0 && document.querySelector(`${sel} tr[data-key="alice"]`) && erp;
    },
    partner,
    { timeout: DEADLINE_MS, polling: 200 },
  );
  assert.ok(sent > 0);
  // Every policy of the document, traffic or not, with its limits.
  const names = await page.$$eval("section.policy", (all) => all.map((s) => s.dataset.policy));
  assert.deepEqual(names, ["partner-api", "erp", "search", "reports", "egress"]);
  assert.match(await page.textContent('section[data-policy="reports"] .limits'), /100 per 1h/);
  assert.match(await page.textContent(`${partner} .limits`), /25 per 5s · 300 per 1m/);
  // Alice is the busiest key, and her row shows what remains, read from Redis.
  assert.equal(await page.getAttribute(`${partner} tbody tr:first-child`, "data-key"), "alice");
  assert.match(await page.textContent(`${partner} tr[data-key="alice"]`), /\d+\/25 left/);
  assert.match(await page.textContent('section[data-policy="erp"] tr[data-key="acme"]'), /\d held · \d waiting/);
  assert.deepEqual(errors, []);
  if (process.env.SLUICE_SCREENSHOTS) {
    mkdirSync(process.env.SLUICE_SCREENSHOTS, { recursive: true });
    await page.screenshot({ path: join(process.env.SLUICE_SCREENSHOTS, "dashboard.png"), fullPage: true });
  }
  await page.close();
});

test("each policy's chart draws its last minutes, failure-mode passes reported by the filter included", async () => {
  // What a filter's worker sends on its tick after failure_mode let requests through.
  const report = { passes: [{ policy: "egress", count: 6 }, { policy: "partner-api", count: 2 }] };
  const res = await fetch(`${shim}/v1/report`, { method: "POST", body: JSON.stringify(report) });
  assert.equal(res.status, 200, await res.text());
  const page = await browser.newPage({ viewport: { width: 900, height: 700 } });
  const errors = [];
  page.on("pageerror", (e) => errors.push(e));
  await page.goto(`${shim}/`);
  const egress = 'section[data-policy="egress"]';
  // Traffic goes on until egress has been admitted at once, held and refused.
  await page.waitForFunction(
    (sel) => ["allowed", "denied", "waited", "failure_passes"].every((series) => {
      const line = document.querySelector(`${sel} figure.history polyline[data-series="${series}"]`);
      return line && Number(line.dataset.total) > 0;
    }),
    egress,
    { timeout: DEADLINE_MS, polling: 200 },
  );
  const chart = await page.$$eval(`${egress} figure.history polyline`, (lines) => lines.map((l) => {
    const ys = l.getAttribute("points").split(" ").map((p) => Number(p.split(",")[1]));
    return { series: l.dataset.series, total: Number(l.dataset.total), points: ys.length, ys: new Set(ys).size };
  }));
  assert.deepEqual(chart.map((c) => c.series), ["allowed", "denied", "waited", "failure_passes"]);
  for (const c of chart) {
    assert.equal(c.points, 120, `${c.series}: 10 minutes of 5-second buckets`);
    assert.ok(c.ys > 1, `${c.series} rises off the baseline`);
  }
  assert.equal(chart[3].total, 6, "the reported passes, once");
  const legend = await page.textContent(`${egress} .legend`);
  assert.match(legend, /failure-mode passes \(not enforced\): 6/);
  const axis = await page.$$eval(`${egress} svg.chart text`, (all) => all.map((t) => t.textContent));
  assert.ok(axis.includes("−10 min") && axis.includes("now") && axis.includes("per second"), axis.join(" | "));
  const partner = await page.getAttribute('section[data-policy="partner-api"] polyline[data-series="failure_passes"]', "data-total");
  assert.equal(partner, "2");
  assert.deepEqual(errors, []);
  if (process.env.SLUICE_SCREENSHOTS) {
    mkdirSync(process.env.SLUICE_SCREENSHOTS, { recursive: true });
    await page.locator(egress).screenshot({ path: join(process.env.SLUICE_SCREENSHOTS, "dashboard-history.png") });
  }
  await page.close();
});

test("the shim serves the playground at /playground/", async () => {
  const page = await browser.newPage();
  await page.goto(`${shim}/playground`);
  await page.waitForSelector("body[data-ready=true]", { timeout: DEADLINE_MS });
  assert.equal(new URL(page.url()).pathname, "/playground/");
  assert.match(await page.textContent("#validity"), /^valid: /);
  await page.close();
});
