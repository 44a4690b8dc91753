// The playground page: validates as you type, runs the pattern on demand.
// Everything is computed by the wasm module (the real sluice_policies).
import init, { validate, run } from "./pkg/sluice_playground.js";

const DOCUMENT = `{
  "policies": [
    {"name": "partner-api", "match": {"path_prefix": "/v42/"}, "key": ["header:x-account"],
     "limits": [{"type": "sliding_window", "limit": 25, "window": "5s"},
                {"type": "sliding_window", "limit": 300, "window": "1m"}]}
  ]
}`;
const PATTERN = `{
  "streams": [
    {"path": "/v42/orders", "headers": {"x-account": "acme"}, "every": "100ms", "until": "12s"},
    {"path": "/v42/orders", "headers": {"x-account": "zeta"}, "burst": 30, "at": "3s"}
  ]
}`;

const $ = (id) => document.getElementById(id);

function showValidity() {
  const reply = JSON.parse(validate($("document").value));
  const box = $("validity");
  box.className = "status " + (reply.ok ? "ok" : "error");
  box.textContent = reply.ok ? `valid: ${reply.policies.length} policies (${reply.policies.join(", ")})` : reply.error;
  return reply.ok;
}

function cell(row, text, cls) {
  const td = row.insertCell();
  td.textContent = text;
  if (cls) td.className = cls;
}

function drawChart(events) {
  const svg = $("chart");
  svg.replaceChildren();
  if (events.length === 0) return;
  const width = svg.clientWidth || 800, height = svg.clientHeight || 160;
  const end = Math.max(...events.map((e) => e.at_ms), 1);
  const streams = Math.max(...events.map((e) => e.stream)) + 1;
  const ns = "http://www.w3.org/2000/svg";
  const colors = { admitted: "#1f9d55", denied: "#d64545", missing_key: "#c98a00", unlimited: "#8891a5" };
  for (const e of events) {
    const dot = document.createElementNS(ns, "circle");
    dot.setAttribute("cx", 10 + (e.at_ms / end) * (width - 20));
    dot.setAttribute("cy", 15 + ((e.stream + 0.5) / streams) * (height - 30));
    dot.setAttribute("r", 3);
    dot.setAttribute("fill", colors[e.decision] || "#000");
    dot.setAttribute("class", e.decision);
    svg.appendChild(dot);
  }
}

function runPattern() {
  if (!showValidity()) return;
  const reply = JSON.parse(run($("document").value, $("pattern").value));
  $("results").hidden = false;
  const body = $("timeline").tBodies[0];
  body.replaceChildren();
  if (!reply.ok) {
    $("summary").textContent = reply.error;
    $("summary").className = "status error";
    $("reports").replaceChildren();
    drawChart([]);
    return;
  }
  const count = (d) => reply.events.filter((e) => e.decision === d).length;
  $("summary").className = "status ok";
  $("summary").textContent = `${reply.events.length} requests: ${count("admitted")} admitted, ${count("denied")} denied`;
  $("reports").replaceChildren(
    ...reply.reports.map((r) => {
      const div = document.createElement("div");
      div.className = "report";
      const limits = r.limits.map((l) => `${l.limit}: peak ${l.peak} of ${l.capacity}`).join("; ");
      let text = `${r.policy}: ${r.matched} matched, ${r.admitted} admitted, ${r.denied} denied. ${limits}`;
      if (r.tokens) {
        text += `. ${r.tokens.charged} LLM tokens charged`;
        if (r.tokens.unlogged) text += ` (${r.tokens.unlogged} requests without "tokens" charged the default reservation)`;
      }
      div.textContent = text;
      return div;
    }),
  );
  reply.events.forEach((e, i) => {
    const row = body.insertRow();
    cell(row, String(i + 1));
    cell(row, `${e.at_ms.toFixed(1)} ms`);
    cell(row, String(e.stream));
    cell(row, e.decision, e.decision);
    cell(row, e.policies.map((p) => `${p.policy} / ${p.key}`).join(", "));
    cell(row, e.policies.map((p) => p.remaining.join(" / ")).join(", "));
  });
  drawChart(reply.events);
}

await init();
$("document").value = DOCUMENT;
$("pattern").value = PATTERN;
$("document").addEventListener("input", showValidity);
$("run").addEventListener("click", runPattern);
showValidity();
document.body.dataset.ready = "true";
