// surge dashboard: drawing the state dashboard.js keeps (plain DOM and SVG, no library).
// Per deployment: load figures, the block grid (nodes as rows, blocks as cells, coloured
// by tier), the execution pipelines with their layer ranges, and a timeline of every node.
"use strict";

const View = (() => {
  const WINDOW_S = 120; // percentiles and rates over the last two minutes
  const RATE_S = 10;
  const W = 900, LANE = 16, TOP = 18, LEFT = 60;
  let pending = false;

  const esc = (s) => String(s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);
  const fmt = (x, unit) => (x === null || x === undefined || Number.isNaN(x) ? "–" : x.toFixed(unit === "ms" ? 0 : 1) + (unit ? " " + unit : ""));

  function pct(xs, p) {
    if (!xs.length) return null;
    const s = xs.slice().sort((a, b) => a - b);
    return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
  }

  function stats(d, now) {
    const recent = d.requests.filter((r) => r.t_s > now - WINDOW_S);
    const ttft = recent.map((r) => r.ttft_s).filter((x) => x !== null).map((x) => x * 1000);
    const itl = recent.map((r) => r.itl_s).filter((x) => x !== null).map((x) => x * 1000);
    const rate = d.requests.filter((r) => r.t_s > now - RATE_S).length / RATE_S;
    const last = d.load.length ? d.load[d.load.length - 1] : null;
    const openPipes = [...d.pipelines.values()].filter((p) => p.state === "open").length;
    return [
      ["rate", fmt(rate, "req/s")],
      ["queue", last ? last.queued : "–"],
      ["ongoing", last ? last.ongoing : "–"],
      ["instances", d.instances.size],
      ["loading", last ? last.loading : "–"],
      ["pipelines", openPipes],
      ["scale-outs", d.scaleOuts],
      ["TTFT p50", fmt(pct(ttft, 50), "ms")], ["TTFT p99", fmt(pct(ttft, 99), "ms")],
      ["ITL p50", fmt(pct(itl, 50), "ms")], ["ITL p99", fmt(pct(itl, 99), "ms")],
    ];
  }

  function best(tiers) {
    if (!tiers) return "";
    for (const t of ["gpu", "host", "disk"]) if (tiers.has(t)) return "tier-" + t;
    return "";
  }

  function grid(d) {
    const rows = S.nodes.map((n) => {
      const per = d.blocks.get(n);
      let cells = "";
      for (let b = 0; b < d.numBlocks; b++) {
        const tiers = per && per.get(b);
        const layers = d.blockLayers[b] ? ` layers ${d.blockLayers[b][0]}–${d.blockLayers[b][1]}` : "";
        cells += `<span class="cell ${best(tiers)}" title="node ${n} block ${b}${layers}: ${tiers ? [...tiers].join(", ") : "absent"}"></span>`;
      }
      const serving = d.instances.has(n) ? "1" : "0";
      const mode = d.modes.get(n);
      const role = d.roles.get(n);
      const badges = (serving === "1" ? `<span class="role instance">instance</span>` : "")
        + (mode === "live" ? `<span class="role live">live</span>` : "")
        + (role ? `<span class="role ${esc(role)}">${esc(role)}</span>` : "");
      return `<div class="node-row" data-node="${n}" data-serving="${serving}"><span class="label">node ${n}</span>${cells}${badges}</div>`;
    });
    return `<div class="grid">${rows.join("")}</div>`;
  }

  function pipelines(d) {
    const list = [...d.pipelines.values()].slice(-8);
    if (!list.length) return "";
    const total = d.numLayers || Math.max(...list.flatMap((p) => p.stages.map((s) => s[2])));
    return `<div class="pipelines">${list.map((p) => {
      const stages = p.stages.map(([n, a, b]) =>
        `<span class="stage" style="width:${(100 * (b - a)) / total}%" title="node ${n}: layers ${a}–${b}">n${n} ${a}–${b}</span>`).join("");
      const state = p.state === "open" ? "serving" : `retired at ${p.t1.toFixed(1)} s`;
      return `<div class="pipeline" data-name="${esc(p.name)}" data-state="${p.state}"><span class="pname" title="${esc(p.name)}">${esc(p.name)}</span><span class="stages">${stages}</span><span class="pstate">${state}</span></div>`;
    }).join("")}</div>`;
  }

  function timeline(d, now) {
    const nodes = S.nodes;
    const t0 = Math.max(0, firstT(d) - 1, now - 300); // from the first event, at most 5 min
    const span = Math.max(5, now - t0);
    const x = (t) => LEFT + ((Math.min(t, now) - t0) / span) * (W - LEFT - 10);
    const y = (n) => TOP + nodes.indexOf(n) * LANE;
    const h = TOP + nodes.length * LANE + 40;
    let g = "";
    for (const n of nodes) g += `<text x="4" y="${y(n) + 11}">node ${n}</text>`;
    for (let k = 0; k <= 5; k++) {
      const t = t0 + (k * span) / 5;
      g += `<text x="${x(t) - 10}" y="12">${t.toFixed(1)} s</text>`;
    }
    for (const [n, bars] of d.lanes) {
      if (!nodes.includes(n)) continue;
      for (const b of bars) {
        const end = b.t1 === null ? now : b.t1;
        if (end < t0) continue;
        const x0 = x(Math.max(b.t0, t0)), w = Math.max(2, x(end) - x0);
        const dy = b.kind === "serving" ? 2 : b.kind === "pipe" ? 5 : 8;
        g += `<rect class="${b.kind}" x="${x0}" y="${y(n) + dy}" width="${w}" height="${b.kind === "serving" ? 12 : 6}"><title>${esc(b.kind)} ${esc(b.detail || "")} ${b.t0.toFixed(2)}–${b.t1 === null ? "now" : b.t1.toFixed(2)} s</title></rect>`;
      }
    }
    const marks = d.marks.filter((m) => m.t >= t0).slice(-3000);
    for (const m of marks) {
      const mx = x(m.t);
      if (m.kind === "scale") g += `<line class="scale" x1="${mx}" x2="${mx}" y1="${TOP - 4}" y2="${h - 36}"><title>${esc(m.text)} at ${m.t.toFixed(2)} s</title></line>`;
      else if (m.kind === "gputick" && nodes.includes(m.node)) g += `<rect class="gputick" x="${mx}" y="${y(m.node) + 13}" width="1.5" height="3"></rect>`;
      else if (m.kind === "drain" && nodes.includes(m.node)) g += `<rect class="drain" x="${mx - 1}" y="${y(m.node) + 1}" width="3" height="14"><title>drained at ${m.t.toFixed(2)} s</title></rect>`;
      else if (m.kind === "handoff" && nodes.includes(m.node) && nodes.includes(m.to)) g += `<line class="handoff" x1="${mx}" x2="${mx}" y1="${y(m.node) + 8}" y2="${y(m.to) + 8}"><title>handoff ${esc(m.text)}</title></line>`;
      else if (m.node !== undefined && nodes.includes(m.node)) g += `<circle class="${m.kind === "livebatch" ? "live" : "consol"}" cx="${mx}" cy="${y(m.node) + 8}" r="3"><title>${esc(m.kind)} ${esc(m.text || "")} at ${m.t.toFixed(2)} s</title></circle>`;
      else if (m.nodes) for (const n of m.nodes) if (nodes.includes(n)) g += `<circle class="consol" cx="${mx}" cy="${y(n) + 8}" r="2.5"><title>${esc(m.kind)} ${esc(m.text || "")}</title></circle>`;
    }
    g += sparks(d, x, t0, h - 34);
    return `<svg class="timeline" viewBox="0 0 ${W} ${h}" preserveAspectRatio="xMinYMin meet">${g}</svg>`;
  }

  function sparks(d, x, t0, top) { // queue, instances, finished requests per second
    const pts = d.load.filter((l) => l.t_s >= t0);
    if (!pts.length) return "";
    const maxQ = Math.max(1, ...pts.map((l) => Math.max(l.queued, l.instances + l.pipelines)));
    const yy = (v) => top + 30 - (v / maxQ) * 28;
    const line = (cls, f) => `<polyline class="${cls}" points="${pts.map((l) => `${x(l.t_s).toFixed(1)},${yy(f(l)).toFixed(1)}`).join(" ")}"></polyline>`;
    return line("spark-queue", (l) => l.queued) + line("spark-inst", (l) => l.instances + l.pipelines)
      + `<text x="4" y="${top + 14}">queue</text><text x="4" y="${top + 26}">serving</text>`;
  }

  function firstT(d) {
    let t = Infinity;
    for (const bars of d.lanes.values()) for (const b of bars) t = Math.min(t, b.t0);
    for (const m of d.marks) t = Math.min(t, m.t);
    return t === Infinity ? 0 : t;
  }

  function render() {
    pending = false;
    const now = window.surgeDashboard ? window.surgeDashboard.now() : S.now;
    document.getElementById("clock").textContent = `t = ${now.toFixed(1)} s`;
    const main = document.getElementById("deployments");
    const deps = [...S.deps.values()].filter((d) => !d.gone);
    if (!deps.length) return;
    main.innerHTML = deps.map((d) => {
      const st = stats(d, now).map(([k, v]) => `<span class="stat" data-stat="${k}"><span>${k}</span><b>${v}</b></span>`).join("");
      return `<section class="deployment" data-model="${esc(d.model)}"><h2>${esc(d.model)}<span class="strategy" title="scale-out strategy">${esc(d.strategy)}</span></h2><div class="stats">${st}</div><div class="panels"><div>${grid(d)}${pipelines(d)}</div><div>${timeline(d, now)}</div></div></section>`;
    }).join("");
    const log = document.getElementById("log");
    log.innerHTML = S.log.slice(-80).reverse().map((e) => {
      const { type, t_s, ...rest } = e;
      const what = Object.entries(rest).map(([k, v]) => `${k}=${Array.isArray(v) ? JSON.stringify(v) : v}`).join(" ");
      return `<li><span class="t">${t_s.toFixed(2)} s</span>${esc(type)} ${esc(what)}</li>`;
    }).join("");
  }

  return {
    schedule() { // at most one draw per frame, however many events came
      if (!pending) { pending = true; requestAnimationFrame(render); }
    },
    render,
  };
})();
