// The Limits dashboard: polls /dashboard.json every second and draws each
// policy. Everything is built with textContent: keys come from requests.
"use strict";

const $ = (tag, props = {}, ...children) => {
  const el = Object.assign(document.createElement(tag), props);
  el.append(...children);
  return el;
};
const rate = (n) => (n >= 10 ? n.toFixed(0) : n.toFixed(1));
const ms = (n) => (n == null ? "—" : n < 1000 ? `${n} ms` : `${(n / 1000).toFixed(1)} s`);

function limitCell(limit, state) {
  if (!state) return $("td", { className: "muted", textContent: "—" });
  const share = limit.capacity ? Math.min(state.remaining / limit.capacity, 1) : 0;
  const bar = $("span", { className: "bar" }, $("i", { style: `width:${(share * 100).toFixed(0)}%` }));
  const parts = [`${state.remaining}/${limit.capacity} left`];
  if (state.held != null) parts.push(`${state.held} held`, `${state.waiters} waiting`);
  else parts.push(`reset ${ms(state.reset_ms)}`);
  return $("td", { className: "state" }, bar, parts.join(" · "));
}

function policyCard(p, seconds) {
  const card = $("section", { className: "policy" });
  card.dataset.policy = p.name;
  card.append(
    $("h2", {}, p.name,
      $("span", { className: "tag", textContent: p.source === "document" ? "from the document" : "seen in traffic" }),
      ...(p.wait ? [$("span", { className: "tag", textContent: "waits" })] : [])),
    $("p", { className: "limits", textContent: p.limits.map((l) => l.text).join(" · ") || "no checks yet" }),
  );
  const rates = $("div", { className: "rates", title: `per second, over the last ${seconds} s` });
  for (const kind of ["allowed", "denied", "waited"]) {
    const box = $("div", { className: `rate ${kind}` }, $("b", { textContent: rate(p.rates[kind]) }), `${kind}/s`);
    box.dataset.rate = kind;
    rates.append(box);
  }
  card.append(rates);
  const t = p.totals;
  const held = p.keys.reduce((sum, k) => sum + k.state.reduce((s, l) => s + (l.held || 0), 0), 0);
  const jobs = [
    ["allowed", t.allowed], ["denied", t.denied], ["immediate", t.immediate], ["waited", t.waited],
    ["wait time", t.waited ? `${ms(Math.round(t.wait_ms / t.waited))} mean` : "—"],
    ["held now (busy keys)", held], ["reclaimed", t.reclaimed], ["errors", t.errors],
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
