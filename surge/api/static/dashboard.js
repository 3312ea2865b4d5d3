// surge dashboard: the state of the cluster as timeline events build it, fed live by the
// server-sent-event stream (/dashboard/events) or by a recorded timeline (?replay=URL).
// Event types and fields are surge/events.py's; drawing is dashboard_view.js's.
"use strict";

const FORMAT = "surge-timeline/1";
const MAX_RECORDED = 200000; // events kept for "save timeline"
const S = {
  nodes: [], deps: new Map(), now: 0, recorded: [], log: [],
  mode: "live", clockBase: null, // live: server t_s = performance.now()/1000 + clockBase
};

function dep(model) {
  let d = S.deps.get(model);
  if (!d) {
    d = { model, strategy: "?", numBlocks: 0, numLayers: 0, blockLayers: [],
      blocks: new Map(), instances: new Map(), lanes: new Map(), modes: new Map(),
      roles: new Map(), pipelines: new Map(), marks: [], requests: [], load: [],
      scaleOuts: 0, drained: 0 };
    S.deps.set(model, d);
  }
  return d;
}

function addNode(n) {
  if (!S.nodes.includes(n)) { S.nodes.push(n); S.nodes.sort((a, b) => a - b); }
}

function lane(d, node, kind, t, detail) { // open a bar on a node's lane
  const l = d.lanes.get(node) || [];
  l.push({ kind, t0: t, t1: null, detail });
  d.lanes.set(node, l);
}

function closeLane(d, node, kind, t, detail) {
  for (const b of d.lanes.get(node) || [])
    if (b.kind === kind && b.t1 === null && (detail === undefined || b.detail === detail)) b.t1 = t;
}

const APPLY = {
  nodes(e) { e.nodes.forEach(addNode); },
  deployment(e) {
    const d = dep(e.model);
    Object.assign(d, { strategy: e.strategy, numBlocks: e.num_blocks, numLayers: e.num_layers,
      blockLayers: e.block_layers || [], gone: false });
  },
  deployment_gone(e) { dep(e.model).gone = true; },
  block(e) {
    const d = dep(e.model); addNode(e.node);
    const per = d.blocks.get(e.node) || new Map();
    const tiers = per.get(e.block) || new Set();
    tiers.add(e.tier); per.set(e.block, tiers); d.blocks.set(e.node, per);
    if (e.tier === "gpu") d.marks.push({ kind: "gputick", t: e.t_s, node: e.node });
    d.numBlocks = Math.max(d.numBlocks, e.block + 1);
  },
  scale_out(e) {
    const d = dep(e.model); d.scaleOuts += 1;
    d.marks.push({ kind: "scale", t: e.t_s, nodes: e.nodes, text: "scale-out → " + e.nodes.join(",") });
  },
  scale_out_done(e) {
    dep(e.model).marks.push({ kind: "done", t: e.t_s, nodes: e.nodes, text: e.kind });
  },
  instance(e) {
    const d = dep(e.model); addNode(e.node);
    if (!d.instances.has(e.node)) lane(d, e.node, "serving", e.t_s, e.name);
    d.instances.set(e.node, e.name); d.modes.delete(e.node);
  },
  instance_drained(e) {
    const d = dep(e.model); d.drained += 1;
    d.instances.delete(e.node); closeLane(d, e.node, "serving", e.t_s);
    const per = d.blocks.get(e.node); // its GPU copy goes with it
    if (per) for (const tiers of per.values()) tiers.delete("gpu");
    d.marks.push({ kind: "drain", t: e.t_s, node: e.node });
  },
  pipeline(e) {
    const d = dep(e.model);
    if (d.pipelines.has(e.name) && d.pipelines.get(e.name).state === "open") return;
    d.pipelines.set(e.name, { name: e.name, stages: e.stages, t0: e.t_s, t1: null, state: "open" });
    for (const [node, a, b] of e.stages) { addNode(node); lane(d, node, "pipe", e.t_s, e.name); }
  },
  pipeline_retired(e) {
    const d = dep(e.model); const p = d.pipelines.get(e.name);
    if (!p || p.state === "retired") return;
    p.state = "retired"; p.t1 = e.t_s; p.moved = e.num_moved;
    for (const [node] of p.stages) closeLane(d, node, "pipe", e.t_s, e.name);
  },
  refactor(e) {
    const d = dep(e.model); const p = d.pipelines.get(e.name);
    if (p) {
      for (const [node] of p.stages) closeLane(d, node, "pipe", e.t_s, e.name);
      p.stages = e.stages; p.refactors = (p.refactors || 0) + 1;
      for (const [node] of e.stages) { addNode(node); lane(d, node, "pipe", e.t_s, e.name); }
    } else APPLY.pipeline(e);
    d.marks.push({ kind: "refactor", t: e.t_s, nodes: e.stages.map((s) => s[0]) });
  },
  mode(e) {
    const d = dep(e.model); d.modes.set(e.node, e.mode);
    if (e.mode === "live") lane(d, e.node, "live", e.t_s);
    else closeLane(d, e.node, "live", e.t_s);
  },
  consolidation(e) {
    const d = dep(e.model);
    d.marks.push({ kind: "consol", t: e.t_s, nodes: e.targets, text: "consolidated" });
  },
  live_batch(e) {
    dep(e.model).marks.push({ kind: "livebatch", t: e.t_s, node: e.new_node, old: e.old_node,
      text: `L0–${e.split_layer} × ${e.num_requests}` });
  },
  pd_role(e) { const d = dep(e.model); addNode(e.node); d.roles.set(e.node, e.role); },
  handoff(e) {
    dep(e.model).marks.push({ kind: "handoff", t: e.t_s, node: e.from_node, to: e.to_node,
      text: `${e.num_requests} req` });
  },
  mutation(e) {
    const d = dep(e.model); d.roles.set(e.node, e.to_role);
    d.marks.push({ kind: "mutation", t: e.t_s, node: e.node, text: `${e.from_role}→${e.to_role}` });
  },
  request(e) { const d = dep(e.model); d.requests.push(e); if (d.requests.length > 20000) d.requests.splice(0, 10000); },
  load(e) { const d = dep(e.model); d.load.push(e); if (d.load.length > 20000) d.load.splice(0, 10000); },
};

const QUIET = new Set(["block", "request", "load"]); // not in the event log

function apply(e) {
  const f = APPLY[e.type];
  if (!f) return; // a newer server's event: ignore it, keep going
  if (e.t_s > S.now) S.now = e.t_s;
  f(e);
  if (!QUIET.has(e.type)) {
    S.log.push(e);
    if (S.log.length > 500) S.log.shift();
  }
}

function record(e) {
  if (S.recorded.length < MAX_RECORDED) S.recorded.push(e);
}

// ---- live -----------------------------------------------------------------------------

function params() { return new URLSearchParams(location.search); }

function connect() {
  const key = params().get("key");
  const src = new EventSource("/dashboard/events" + (key ? "?key=" + encodeURIComponent(key) : ""));
  const status = document.getElementById("status");
  src.onopen = () => { status.textContent = "connected"; status.className = "status ok"; };
  src.onerror = () => { status.textContent = "reconnecting…"; status.className = "status bad"; };
  src.onmessage = (m) => {
    const e = JSON.parse(m.data);
    if (e.type === "nodes") S.clockBase = e.t_s - performance.now() / 1000;
    record(e); apply(e); View.schedule();
  };
  S.source = src;
}

function liveNow() {
  if (S.mode === "live" && S.clockBase !== null)
    S.now = Math.max(S.now, performance.now() / 1000 + S.clockBase);
  return S.now;
}

// ---- replay ---------------------------------------------------------------------------

const R = { events: [], i: 0, t: 0, speed: 1, playing: true, last: null };

function startReplay(timeline, name) {
  if (!timeline || timeline.format !== FORMAT || !Array.isArray(timeline.events))
    throw new Error(`${name} is not a surge timeline (format ${FORMAT})`);
  if (S.source) S.source.close();
  S.mode = "replay"; S.deps.clear(); S.nodes = []; S.log = []; S.now = 0; S.recorded = [];
  R.events = timeline.events.slice().sort((a, b) => a.t_s - b.t_s);
  R.i = 0; R.t = R.events.length ? R.events[0].t_s : 0; R.last = null;
  const sp = params().get("speed");
  if (sp !== null) R.speed = sp === "max" ? 0 : Number(sp) || 1;
  document.getElementById("speed").value = String(R.speed);
  document.getElementById("mode").textContent = "replay: " + (timeline.source || name);
  document.getElementById("replay-controls").hidden = false;
  document.getElementById("status").textContent = `${R.events.length} events`;
  document.getElementById("status").className = "status ok";
  requestAnimationFrame(tick);
}

function tick(ms) {
  if (R.playing) {
    if (R.speed === 0) R.t = Infinity;
    else if (R.last !== null) R.t += ((ms - R.last) / 1000) * R.speed;
    R.last = ms;
    while (R.i < R.events.length && R.events[R.i].t_s <= R.t) {
      const e = R.events[R.i++]; record(e); apply(e);
    }
    if (R.speed !== 0) S.now = Math.max(S.now, R.t);
    View.schedule();
  } else R.last = null;
  if (R.i < R.events.length) requestAnimationFrame(tick);
  else {
    document.getElementById("status").textContent = `replayed ${R.events.length} events`;
    document.body.dataset.replayDone = "1";
  }
}

async function replayUrl(url) {
  try {
    const r = await fetch(url);
    if (!r.ok) throw new Error(`${url}: HTTP ${r.status}`);
    startReplay(await r.json(), url);
  } catch (err) {
    const s = document.getElementById("status");
    s.textContent = "cannot replay: " + err.message; s.className = "status bad";
  }
}

// ---- controls -------------------------------------------------------------------------

function timeline() {
  return { format: FORMAT, source: S.mode === "live" ? "dashboard (live)" : "dashboard (replay)",
    events: S.recorded };
}

function save() {
  const blob = new Blob([JSON.stringify(timeline())], { type: "application/json" });
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob); a.download = "surge-timeline.json"; a.click();
}

document.getElementById("save").onclick = save;
document.getElementById("play").onclick = (ev) => {
  R.playing = !R.playing; ev.target.textContent = R.playing ? "pause" : "play";
};
document.getElementById("speed").onchange = (ev) => { R.speed = Number(ev.target.value); };
document.getElementById("file").onchange = async (ev) => {
  const f = ev.target.files[0];
  if (!f) return;
  try { startReplay(JSON.parse(await f.text()), f.name); } catch (err) {
    const s = document.getElementById("status");
    s.textContent = "cannot replay: " + err.message; s.className = "status bad";
  }
};

window.surgeDashboard = { state: S, timeline, apply, now: liveNow };

const replay = params().get("replay");
if (replay) replayUrl(replay); else connect();
setInterval(() => View.schedule(), 1000); // the clock and the windows move on
