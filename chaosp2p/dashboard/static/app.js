// chaosp2p dashboard: renders the feed of /api/events (Server-Sent Events) into the page.
// Every string that comes from the swarm is untrusted: it only ever reaches the DOM through
// textContent or setAttribute on inert attributes (title, data-*), never through an HTML parser.
"use strict";
(() => {
  const SVG = "http://www.w3.org/2000/svg";
  const WIDTH = 640, HEIGHT = 420, MAX_EVENTS = 300;
  const model = { snapshot: null, events: [], lastSeq: 0, lagged: 0, positions: new Map(), velocity: new Map() };
  let alpha = 0, animating = false, graphNodes = [], graphLinks = [];

  // ----------------------------------------------------------------- helpers
  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }
  function svg(tag, attrs) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    return node;
  }
  function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }
  function short(id) { return typeof id === "string" && id.length > 10 ? "…" + id.slice(-8) : String(id ?? "?"); }
  function num(x, digits) { return typeof x === "number" && isFinite(x) ? x.toFixed(digits) : "–"; }
  function bytes(n) {
    if (typeof n !== "number" || !isFinite(n)) return "–";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return (i ? n.toFixed(1) : n.toFixed(0)) + " " + units[i];
  }
  function rate(n) { return typeof n === "number" && n > 0 ? bytes(n) + "/s" : "–"; }
  function clock(t, millis = true) {
    if (typeof t !== "number") return "–";
    const d = new Date(t * 1000);
    const text = d.toLocaleTimeString([], { hour12: false });
    return millis ? text + "." + String(d.getMilliseconds()).padStart(3, "0") : text;
  }
  function scalar(v) {
    if (v === null || v === undefined) return "–";
    if (Array.isArray(v)) return v.length + " item" + (v.length === 1 ? "" : "s");
    if (typeof v === "object") return JSON.stringify(v);
    if (typeof v === "number") return Number.isInteger(v) ? String(v) : v.toPrecision(4);
    return String(v);
  }
  function stateClass(s) { return ["alive", "suspect", "failed", "left"].includes(s) ? s : "left"; }
  function cell(row, text, className, title) {
    const td = el("td", className, text);
    if (title) td.setAttribute("title", title);
    row.appendChild(td);
    return td;
  }

  // ----------------------------------------------------------------- header and members
  function renderHeader(s) {
    const self = document.getElementById("self");
    self.textContent = short(s.self.peer_id) + " · " + s.self.role + " · " + s.self.agent;
    self.setAttribute("title", s.self.peer_id);
    const counts = {};
    for (const m of s.members) counts[m.state] = (counts[m.state] || 0) + 1;
    document.getElementById("summary").textContent = ["alive", "suspect", "failed", "left"]
      .filter((k) => counts[k]).map((k) => counts[k] + " " + k).join(" · ");
    const f = s.feed || {};
    document.getElementById("feed-stats").textContent =
      "feed: " + (f.clients ?? "?") + " browser(s), " + (f.events ?? 0) + " events, " +
      (f.events_dropped ?? 0) + " dropped for slow browsers; this page missed " + model.lagged +
      (s.omitted && (s.omitted.members || s.omitted.links)
        ? "; not shown: " + s.omitted.members + " members, " + s.omitted.links + " links" : "");
  }

  function renderMembers(s) {
    const body = document.querySelector("#members tbody");
    clear(body);
    for (const m of s.members) {
      const row = el("tr", stateClass(m.state));
      row.dataset.peer = m.peer_id;
      row.dataset.state = m.state;
      const stateCell = cell(row, "");
      stateCell.appendChild(el("span", "badge " + stateClass(m.state), m.state));
      const peerCell = cell(row, short(m.peer_id), "peer", m.peer_id + "\n" + (m.addrs || []).join("\n"));
      if (m.is_local) peerCell.appendChild(el("span", "tag", m.role || "local"));
      cell(row, m.agent ?? "–", "agent", m.agent ?? "");
      const r = m.resources || {};
      cell(row, m.incarnation, "num");
      cell(row, r.cpu_cores || "–", "num");
      cell(row, r.memory_bytes ? bytes(r.memory_bytes) : "–", "num");
      cell(row, r.gpus ? r.gpus + (r.gpu_memory_bytes ? " (" + bytes(r.gpu_memory_bytes) + ")" : "") : "–", "num");
      cell(row, r.train_samples_per_s ? num(r.train_samples_per_s, 1) : "–", "num");
      cell(row, m.rtt_ms === null || m.rtt_ms === undefined ? "–" : num(m.rtt_ms, 2) + " ms", "num");
      cell(row, clock(m.since, false));
      body.appendChild(row);
    }
    document.getElementById("member-count").textContent = "(" + s.members.length + ")";
  }

  // ----------------------------------------------------------------- runs and transfers
  const RUN_COLUMNS = ["run", "epoch", "step", "activation_step", "loss", "members", "pending", "waiting_for",
    "config_digest", "reported_by"];
  // What a member's round waits for (issue 19): "6.1 s: contributions from ab12cd34, results from ..."
  function waitingText(w) {
    if (!w || typeof w !== "object") return "–";
    const parts = [];
    if (Array.isArray(w.contributions_from) && w.contributions_from.length)
      parts.push("contributions from " + w.contributions_from.map(short).join(", "));
    if (Array.isArray(w.results_from) && w.results_from.length)
      parts.push("results from " + w.results_from.map(short).join(", "));
    if (!parts.length && Array.isArray(w.peers)) parts.push(w.peers.map(short).join(", "));
    return num(Number(w.waited_s) || 0, 1) + " s: " + parts.join("; ");
  }
  function runCell(key, v) {
    if (key === "waiting_for") return waitingText(v);
    if (Array.isArray(v)) return String(v.length); // members, pending: a count (the list in the tooltip)
    if (key === "reported_by") return short(v);
    if (key === "config_digest" && typeof v === "string" && v.length > 12) return v.slice(0, 12) + "…";
    return scalar(v);
  }
  function renderRuns(s) {
    const box = document.getElementById("runs");
    clear(box);
    document.getElementById("run-count").textContent = s.runs.length ? "(" + s.runs.length + ")" : "";
    if (!s.runs.length) { box.appendChild(el("p", "empty", "no training run reported")); return; }
    const keys = RUN_COLUMNS.filter((k) => s.runs.some((r) => k in r));
    for (const r of s.runs) for (const k of Object.keys(r)) if (!keys.includes(k) && k !== "times") keys.push(k);
    const table = el("table", "runs");
    const head = el("tr");
    for (const k of keys) head.appendChild(el("th", null, k));
    table.appendChild(el("thead")).appendChild(head);
    const body = table.appendChild(el("tbody"));
    for (const r of s.runs) {
      const row = el("tr");
      if (typeof r.run === "string") row.dataset.run = r.run;
      for (const k of keys) {
        const v = r[k];
        const tip = k === "waiting_for" && v && Array.isArray(v.links) ? "links " + v.links.join(", ")
          : Array.isArray(v) ? v.map(scalar).join("\n") : typeof v === "string" ? v : "";
        cell(row, runCell(k, v), typeof v === "number" || Array.isArray(v) ? "num" : "", tip);
      }
      body.appendChild(row);
    }
    box.appendChild(table);
  }

  function renderTransfers(s) {
    const box = document.getElementById("transfers");
    clear(box);
    document.getElementById("transfer-count").textContent = s.transfers.length ? "(" + s.transfers.length + ")" : "";
    if (!s.transfers.length) { box.appendChild(el("p", "empty", "none")); return; }
    const table = el("table");
    const head = el("tr");
    for (const k of ["run", "step", "progress", "rate", "ETA", "sources"]) head.appendChild(el("th", null, k));
    table.appendChild(el("thead")).appendChild(head);
    const body = table.appendChild(el("tbody"));
    for (const t of s.transfers) {
      const row = el("tr");
      if (typeof t.run === "string") row.dataset.run = t.run;
      cell(row, scalar(t.run));
      cell(row, scalar(t.step), "num");
      const p = cell(row, "");
      const bar = el("progress");
      bar.max = 1;
      bar.value = typeof t.fraction === "number" ? t.fraction : 0;
      p.appendChild(bar);
      p.appendChild(document.createTextNode(" " + num((t.fraction || 0) * 100, 1) + "% of " + bytes(t.bytes_total)));
      cell(row, rate(t.rate_bytes_per_s), "num");
      cell(row, typeof t.eta_s === "number" ? num(t.eta_s, 1) + " s" : "–", "num");
      const sources = (t.sources || []).map((src) =>
        short(src.peer) + " " + rate(src.rate_bytes_per_s) + (src.active ? "" : " (idle)"));
      cell(row, sources.join(", "), "sources");
      body.appendChild(row);
    }
    box.appendChild(table);
  }

  // ----------------------------------------------------------------- events
  function eventClass(kind) {
    if (/Fail|Down|Left|Disconnect/.test(kind)) return "fail";
    if (/Suspect/.test(kind)) return "suspect";
    if (/Join|Alive|Connected/.test(kind)) return "join";
    if (/Link/.test(kind)) return "link";
    return "other";
  }
  // Other fields as key=value; times (detected_at, committed_at, ...) relative to the event's own.
  function eventDetails(e) {
    const parts = [];
    const times = e.times || {};
    const base = typeof times.at === "number" ? times.at : Math.min(...Object.values(times));
    for (const [k, v] of Object.entries(e.fields || {})) {
      if (k === "at" || k === "peer" || k === "peer_id" || (k === "subject" && v === e.peer)) continue;
      if (k in times && isFinite(base)) {
        const ms = (times[k] - base) * 1000;
        parts.push(k + " " + (ms < 0 ? "−" : "+") + Math.abs(ms).toFixed(0) + " ms");
      } else if (/_s$/.test(k) && typeof v === "number") {
        parts.push(k.slice(0, -2) + "=" + (Math.abs(v) < 1 ? (v * 1000).toFixed(1) + " ms" : v.toFixed(2) + " s"));
      } else {
        parts.push(k + "=" + scalar(v));
      }
    }
    return parts.join("  ");
  }
  function eventItem(e) {
    const li = el("li", eventClass(String(e.kind)));
    li.dataset.kind = e.kind;
    if (e.peer) li.dataset.peer = e.peer;
    li.appendChild(el("span", "time", clock(e.time)));
    li.appendChild(el("span", "kind", e.kind));
    const peer = li.appendChild(el("span", "peer", e.peer ? short(e.peer) : ""));
    if (e.peer) peer.setAttribute("title", e.peer);
    const details = li.appendChild(el("span", "details", eventDetails(e)));
    details.setAttribute("title", details.textContent);
    return li;
  }
  function addEvents(events) {
    const list = document.getElementById("events");
    for (const e of events) {
      if (typeof e.seq === "number") {
        if (e.seq <= model.lastSeq) continue; // already shown (a reconnect repeats the history)
        model.lastSeq = e.seq;
      }
      model.events.push(e);
      list.insertBefore(eventItem(e), list.firstChild);
    }
    while (model.events.length > MAX_EVENTS) model.events.shift();
    while (list.children.length > MAX_EVENTS) list.removeChild(list.lastChild);
    document.getElementById("event-count").textContent = "(" + model.events.length + ")";
  }

  // ----------------------------------------------------------------- topology graph
  function renderGraph(s) {
    const ids = new Set(s.members.map((m) => m.peer_id));
    for (const id of [...model.positions.keys()]) if (!ids.has(id)) { model.positions.delete(id); model.velocity.delete(id); }
    let added = false;
    for (const m of s.members) {
      if (!model.positions.has(m.peer_id)) {
        const a = Math.random() * 2 * Math.PI;
        model.positions.set(m.peer_id, { x: WIDTH / 2 + 60 * Math.cos(a), y: HEIGHT / 2 + 60 * Math.sin(a) });
        model.velocity.set(m.peer_id, { x: 0, y: 0 });
        added = true;
      }
    }
    // One edge per pair of peers: up if either direction is up; best RTT, best bandwidth.
    const pairs = new Map();
    for (const l of s.links) {
      if (!ids.has(l.source) || !ids.has(l.target) || l.source === l.target) continue;
      const key = l.source < l.target ? l.source + " " + l.target : l.target + " " + l.source;
      const p = pairs.get(key) || { a: l.source, b: l.target, up: false, rtt: null, bw: null };
      p.up = p.up || l.up;
      if (typeof l.rtt_ms === "number") p.rtt = p.rtt === null ? l.rtt_ms : Math.min(p.rtt, l.rtt_ms);
      if (typeof l.bandwidth_bytes_per_s === "number") p.bw = Math.max(p.bw || 0, l.bandwidth_bytes_per_s);
      pairs.set(key, p);
    }
    const structure = [...pairs.keys()].sort().join("|");
    if (added || structure !== renderGraph.structure) alpha = 1;
    renderGraph.structure = structure;
    graphLinks = [...pairs.values()];
    graphNodes = s.members;

    const linkLayer = document.getElementById("graph-links");
    clear(linkLayer);
    for (const p of graphLinks) {
      const width = p.bw ? Math.max(1.5, Math.min(7, Math.log10(p.bw) - 4)) : 1.5;
      const line = svg("line", { class: "link " + (p.up ? "up" : "down"), "stroke-width": width.toFixed(1) });
      line.dataset.a = p.a;
      line.dataset.b = p.b;
      const title = svg("title");
      title.textContent = short(p.a) + " – " + short(p.b) + ": " + (p.up ? "up" : "down") +
        ", RTT " + (p.rtt === null ? "–" : num(p.rtt, 2) + " ms") + ", bandwidth " + rate(p.bw);
      line.appendChild(title);
      p.element = line;
      linkLayer.appendChild(line);
    }
    const nodeLayer = document.getElementById("graph-nodes");
    clear(nodeLayer);
    for (const m of graphNodes) {
      const g = svg("g", { class: "node " + stateClass(m.state) + (m.is_local ? " local" : "") });
      g.dataset.peer = m.peer_id;
      g.dataset.state = m.state;
      g.appendChild(svg("circle", { r: m.is_local ? 11 : 9 }));
      const label = svg("text", { x: 13, y: 4 });
      label.textContent = short(m.peer_id) + (m.is_local ? " (" + (m.role || "local") + ")" : "");
      g.appendChild(label);
      const title = svg("title");
      title.textContent = m.peer_id + "\n" + m.state + ", incarnation " + m.incarnation + (m.agent ? "\n" + m.agent : "");
      g.appendChild(title);
      m.element = g;
      nodeLayer.appendChild(g);
    }
    place();
    if (alpha > 0.02 && !animating) { animating = true; requestAnimationFrame(tick); }
  }

  // A small force layout: pairwise repulsion, springs along links, a pull to the centre. It runs
  // only while it settles (alpha decays each frame), so an idle page does no work.
  function tick() {
    const ids = graphNodes.map((m) => m.peer_id);
    const pos = model.positions, vel = model.velocity;
    const n = ids.length;
    for (let i = 0; i < n; i++) {
      const p = pos.get(ids[i]), v = vel.get(ids[i]);
      if (!p || !v) continue;
      for (let j = i + 1; j < n; j++) {
        const q = pos.get(ids[j]), w = vel.get(ids[j]);
        if (!q || !w) continue;
        let dx = p.x - q.x, dy = p.y - q.y, d2 = dx * dx + dy * dy;
        if (d2 < 1) { dx = Math.random() - 0.5; dy = Math.random() - 0.5; d2 = 1; }
        const f = (9000 / d2) * alpha, d = Math.sqrt(d2);
        v.x += (dx / d) * f; v.y += (dy / d) * f; w.x -= (dx / d) * f; w.y -= (dy / d) * f;
      }
      v.x += (WIDTH / 2 - p.x) * 0.01 * alpha;
      v.y += (HEIGHT / 2 - p.y) * 0.01 * alpha;
    }
    for (const l of graphLinks) {
      const p = pos.get(l.a), q = pos.get(l.b);
      if (!p || !q) continue;
      const dx = q.x - p.x, dy = q.y - p.y, d = Math.max(1, Math.hypot(dx, dy));
      const f = (d - 130) * 0.03 * alpha;
      const va = vel.get(l.a), vb = vel.get(l.b);
      va.x += (dx / d) * f; va.y += (dy / d) * f; vb.x -= (dx / d) * f; vb.y -= (dy / d) * f;
    }
    for (const id of ids) {
      const p = pos.get(id), v = vel.get(id);
      if (!p || !v) continue;
      v.x *= 0.6; v.y *= 0.6;
      p.x = Math.max(20, Math.min(WIDTH - 90, p.x + v.x));
      p.y = Math.max(20, Math.min(HEIGHT - 20, p.y + v.y));
    }
    place();
    alpha *= 0.97;
    if (alpha > 0.02) requestAnimationFrame(tick); else animating = false;
  }

  function place() {
    for (const m of graphNodes) {
      const p = model.positions.get(m.peer_id);
      if (p && m.element) m.element.setAttribute("transform", "translate(" + p.x.toFixed(1) + "," + p.y.toFixed(1) + ")");
    }
    for (const l of graphLinks) {
      const p = model.positions.get(l.a), q = model.positions.get(l.b);
      if (!p || !q || !l.element) continue;
      l.element.setAttribute("x1", p.x.toFixed(1)); l.element.setAttribute("y1", p.y.toFixed(1));
      l.element.setAttribute("x2", q.x.toFixed(1)); l.element.setAttribute("y2", q.y.toFixed(1));
    }
  }

  // ----------------------------------------------------------------- the feed
  function applySnapshot(s) {
    model.snapshot = s;
    renderHeader(s);
    renderMembers(s);
    renderGraph(s);
    renderRuns(s);
    renderTransfers(s);
  }

  // Applies one feed message (what the event stream delivers); exposed for scripted checks.
  function apply(kind, data) {
    if (kind === "snapshot") applySnapshot(data);
    else if (kind === "event") addEvents([data]);
    else if (kind === "history") {
      const events = data.events || [];
      // A restarted dashboard numbers its events from 1 again.
      if (events.length && events[events.length - 1].seq < model.lastSeq) model.lastSeq = 0;
      addEvents(events);
    }
    else if (kind === "lag") { model.lagged = data.dropped; if (model.snapshot) renderHeader(model.snapshot); }
  }

  function setStatus(status, text) {
    const badge = document.getElementById("conn");
    badge.dataset.status = status;
    badge.textContent = text;
  }

  function connect() {
    const source = new EventSource("api/events");
    for (const kind of ["snapshot", "event", "history", "lag"]) {
      source.addEventListener(kind, (message) => {
        let data;
        try { data = JSON.parse(message.data); } catch (err) { return; }
        apply(kind, data);
      });
    }
    source.onopen = () => setStatus("live", "live");
    source.onerror = () => {
      if (source.readyState === EventSource.CLOSED) {
        // Refused (busy, or no token): the browser will not retry by itself.
        setStatus("refused", "disconnected; retrying in 10 s");
        source.close();
        setTimeout(connect, 10000);
      } else {
        setStatus("reconnecting", "reconnecting");
      }
    };
  }

  window.chaosp2pDashboard = { apply, model };
  connect();
})();
