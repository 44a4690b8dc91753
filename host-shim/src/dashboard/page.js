// The Limits dashboard: polls /dashboard.json every second and draws each
// policy, with a chart of its last minutes drawn here as inline SVG (no
// library, no network). Everything is built with textContent: keys and
// names come from requests.
"use strict";

const $ = (tag, props = {}, ...children) => {
  const el = Object.assign(document.createElement(tag), props);
  el.append(...children);
  return el;
};
const rate = (n) => (n >= 10 ? n.toFixed(0) : n.toFixed(1));
// A span for people: "250 ms", "4.2 s", "3 min 20 s", "21 h 48 min", "2 d 3 h".
const ms = (n) => {
  if (n == null) return "—";
  if (n < 1000) return `${Math.round(n)} ms`;
  if (n < 60000) return `${(n / 1000).toFixed(1)} s`;
  const s = Math.round(n / 1000);
  const [d, h, m] = [Math.floor(s / 86400), Math.floor(s / 3600) % 24, Math.floor(s / 60) % 60];
  if (d) return `${d} d ${h} h`;
  if (h) return `${h} h ${m} min`;
  return `${m} min ${s % 60} s`;
};

const SVG = "http://www.w3.org/2000/svg";
const svg = (tag, attrs = {}, ...children) => {
  const el = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs)) el.setAttribute(name, value);
  el.append(...children);
  return el;
};
// The history's series: JSON field, legend, colour, dashes.
const SERIES = [
  ["allowed", "allowed", "#067647", ""],
  ["denied", "denied", "#b42318", ""],
  ["waited", "waited", "#dc6803", ""],
  ["failure_passes", "failure-mode passes (not enforced)", "#7a5af8", "5 3"],
];
// 1, 2 or 5 times a power of ten, at least n.
const niceCeil = (n) => {
  const p = 10 ** Math.floor(Math.log10(n));
  return [1, 2, 5, 10].map((m) => m * p).find((v) => v >= n);
};

// One policy's last minutes: each series per second, one point per bucket
// (the last still filling), oldest on the left.
function historyChart(h) {
  const [W, H, L, R, T, B] = [720, 132, 40, 10, 14, 22];
  const n = h.allowed.length, span = n * h.bucket_seconds;
  const perSecond = (count) => count / h.bucket_seconds;
  const top = niceCeil(Math.max(1, ...SERIES.flatMap(([key]) => h[key].map(perSecond))));
  const x = (secondsAgo) => L + (1 - secondsAgo / span) * (W - L - R);
  const y = (v) => T + (1 - v / top) * (H - T - B);
  const totals = Object.fromEntries(SERIES.map(([key]) => [key, h[key].reduce((a, b) => a + b, 0)]));
  const minutes = span / 60;
  const chart = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img" },
    svg("title", {}, `per second over the last ${minutes} minutes, in ${h.bucket_seconds}-second buckets`),
    svg("line", { x1: L, x2: W - R, y1: y(top), y2: y(top), class: "grid" }),
    svg("line", { x1: L, x2: W - R, y1: y(top / 2), y2: y(top / 2), class: "grid" }),
    svg("line", { x1: L, x2: W - R, y1: y(0), y2: y(0), class: "axis" }),
    svg("text", { x: L - 6, y: y(top) + 4, "text-anchor": "end" }, rate(top)),
    svg("text", { x: L - 6, y: y(top / 2) + 4, "text-anchor": "end" }, rate(top / 2)),
    svg("text", { x: L - 6, y: y(0) + 4, "text-anchor": "end" }, "0"),
    svg("text", { x: L, y: 10, class: "unit" }, "per second"),
  );
  for (const [ago, label, anchor] of [[span, `−${minutes} min`, "start"], [span / 2, `−${minutes / 2} min`, "middle"], [0, "now", "end"]]) {
    chart.append(svg("line", { x1: x(ago), x2: x(ago), y1: y(0), y2: y(0) + 4, class: "axis" }),
      svg("text", { x: x(ago), y: H - 4, "text-anchor": anchor }, label));
  }
  for (const [key, , colour, dashes] of SERIES) {
    const points = h[key].map((count, i) => `${x((n - 1 - i) * h.bucket_seconds).toFixed(1)},${y(perSecond(count)).toFixed(1)}`);
    const line = svg("polyline", { points: points.join(" "), fill: "none", stroke: colour, "stroke-width": 2,
      "stroke-linejoin": "round", "stroke-dasharray": dashes });
    line.dataset.series = key;
    line.dataset.total = totals[key];
    chart.append(line);
  }
  if (SERIES.every(([key]) => totals[key] === 0)) {
    chart.append(svg("text", { x: (L + W - R) / 2, y: y(top / 2) + 4, "text-anchor": "middle", class: "empty" },
      `nothing in the last ${minutes} minutes`));
  }
  const legend = $("ul", { className: "legend" }, ...SERIES.map(([key, label, colour, dashes]) => {
    const item = $("li", {}, $("i", { style: `border-top: 3px ${dashes ? "dashed" : "solid"} ${colour}` }),
      `${label}: ${totals[key]}`);
    item.dataset.series = key;
    return item;
  }));
  const box = $("figure", { className: "history" }, chart, legend);
  box.dataset.history = "";
  return box;
}

function limitCell(limit, state) {
  if (!state) return $("td", { className: "muted", textContent: "—" });
  const share = limit.capacity ? Math.min(state.remaining / limit.capacity, 1) : 0;
  const bar = $("span", { className: "bar" }, $("i", { style: `width:${(share * 100).toFixed(0)}%` }));
  const unit = limit.unit ? ` ${limit.unit}` : "";
  const parts = [`${state.remaining}/${limit.capacity}${unit} left`];
  if (state.held != null) parts.push(`${state.held} held`, `${state.waiters} waiting`);
  else parts.push(`reset ${ms(state.reset_ms)}`);
  return $("td", { className: "state" }, bar, parts.join(" · "));
}

/** How each face's requests reach Sluice, for the card's tag. */
const FACES = { filter: "Sluice filter", rls: "Envoy RLS", rlqs: "Envoy RLQS" };

function policyCard(p, seconds) {
  const card = $("section", { className: "policy" });
  card.dataset.policy = p.name;
  card.append(
    $("h2", {}, p.name,
      $("span", { className: "tag", textContent: p.source === "document" ? "from the document" : "seen in traffic" }),
      ...(p.wait ? [$("span", { className: "tag", textContent: "waits" })] : []),
      ...(p.face ? [$("span", { className: "tag face", textContent: FACES[p.face] || p.face })] : [])),
    $("p", { className: "limits", textContent: p.limits.map((l) => l.text).join(" · ") || "no checks yet" }),
  );
  const rates = $("div", { className: "rates", title: `per second, over the last ${seconds} s` });
  for (const kind of ["allowed", "denied", "waited"]) {
    const box = $("div", { className: `rate ${kind}` }, $("b", { textContent: rate(p.rates[kind]) }), `${kind}/s`);
    box.dataset.rate = kind;
    rates.append(box);
  }
  card.append(rates, historyChart(p.history));
  const t = p.totals;
  const held = p.keys.reduce((sum, k) => sum + k.state.reduce((s, l) => s + ((l && l.held) || 0), 0), 0);
  const jobs = [
    ["allowed", t.allowed], ["denied", t.denied],
    ["of them by the gateway's cache", t.cache_denied], ["immediate", t.immediate], ["waited", t.waited],
    ["wait time", t.waited ? `${ms(Math.round(t.wait_ms / t.waited))} mean` : "—"],
    ["held now (busy keys)", held], ["reclaimed", t.reclaimed], ["errors", t.errors],
    ["failure-mode passes (reported)", t.failure_passes],
  ];
  card.append($("p", { className: "jobs" }, ...jobs.map(([k, v]) => $("span", { textContent: `${k}: ${v}` }))));
  if (p.keys.length) {
    const head = $("tr", {}, $("th", { textContent: "busiest keys" }), $("th", { textContent: "checks" }),
      ...p.limits.map((l) => $("th", { textContent: l.text })));
    const rows = p.keys.map((k) => {
      const row = $("tr", {}, $("td", { className: "key", textContent: k.key || "(one bucket)" }), $("td", { textContent: k.checks }));
      row.dataset.key = k.key;
      if (k.state_error) row.append($("td", { className: "muted", colSpan: p.limits.length, textContent: k.state_error }));
      else row.append(...p.limits.map((l, i) => limitCell(l, k.state[i])));
      return row;
    });
    card.append($("table", {}, $("thead", {}, head), $("tbody", {}, ...rows)));
  }
  return card;
}

async function refresh() {
  const status = document.getElementById("status");
  try {
    const res = await fetch("/dashboard.json", { cache: "no-store" });
    if (!res.ok) throw new Error(`HTTP ${res.status}`);
    const data = await res.json();
    document.getElementById("policies").replaceChildren(...data.policies.map((p) => policyCard(p, data.rate_seconds)));
    status.className = data.redis_error ? "error" : "";
    status.textContent = data.redis_error
      ? `Redis: ${data.redis_error}`
      : `${data.policies.length} policies · updated ${new Date(data.now_ms).toLocaleTimeString()}`;
    document.body.dataset.ready = "true";
  } catch (err) {
    status.className = "error";
    status.textContent = `cannot reach the shim: ${err.message}`;
  }
}

refresh();
setInterval(refresh, 1000);
