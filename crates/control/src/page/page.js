// The status page's script (see index.html): polls the read endpoints and
// renders them. Values go in with textContent only.
"use strict";

const REFRESH_MS = 2000;

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function row(cells, id) {
  const tr = document.createElement("tr");
  for (const c of cells) tr.appendChild(c);
  if (id) tr.id = id;
  return tr;
}

function num(value, id) {
  const td = el("td", value === null || value === undefined ? "–" : value, "num");
  if (id) td.id = id;
  return td;
}

function fill(tbody, rows, columns) {
  tbody.replaceChildren(...rows);
  if (rows.length === 0) {
    const td = el("td", "none yet", "empty");
    td.colSpan = columns;
    tbody.appendChild(row([td]));
  }
}

function time(ms) {
  return ms ? new Date(ms).toLocaleTimeString() : "–";
}

function ranges(rs) {
  return rs.map((r) => `${r.topic}[${r.partition}] ${r.from}..${r.until}`).join(", ");
}

function renderStatus(status) {
  const running = status.running || {};
  const active = status.active;
  document.getElementById("pipeline").textContent = running.pipeline || (active && active.pipeline) || "";
  document.getElementById("active-version").textContent = active ? "v" + active.version : "none";
  document.getElementById("active-module").textContent = active ? active.module_digest.slice(0, 12) : "–";
  for (const k of ["batches", "records", "rows", "dead_letters", "fenced"]) {
    document.getElementById("counter-" + k).textContent = running[k] ?? "–";
  }
  const problem = document.getElementById("version-problem");
  problem.hidden = !running.version_problem;
  problem.textContent = running.version_problem || "";
  const stall = document.getElementById("stalled");
  stall.hidden = !running.stalled;
  stall.textContent = running.stalled
    ? `Stalled since ${time(running.stalled.since_ms)} on batch ${running.stalled.batch_id}: ${running.stalled.reason}`
    : "";

  fill(document.getElementById("partitions"), (running.partitions || []).map((p) => {
    const key = `${p.topic}-${p.partition}`;
    return row([el("td", p.topic), num(p.partition), num(p.next_offset, "checkpoint-" + key),
      num(p.log_end, "log-end-" + key), num(p.lag, "lag-" + key)], "partition-" + key);
  }), 5);

  fill(document.getElementById("batches"), (running.recent_batches || []).map((b) =>
    row([el("td", b.batch_id), el("td", ranges(b.ranges)), num(b.records), num(b.rows),
      num(b.dead_letters), num(b.commit_ms), el("td", time(b.committed_at_ms))], "batch-" + b.batch_id)), 7);

  fill(document.getElementById("dead-letters"), (running.recent_dead_letters || []).map((d) =>
    row([el("td", d.record), el("td", d.kind), el("td", d.batch_id)])), 3);

  chart(running.timeline || []);
}

function renderVersions(versions) {
  const history = (versions.history || []).slice().reverse();
  fill(document.getElementById("history"), history.map((v) =>
    row([num("v" + v.version), el("td", v.action), el("td", v.module_digest.slice(0, 12)),
      el("td", v.params_digest.slice(0, 12)), el("td", new Date(v.activated_at_ms).toLocaleString())],
      "version-" + v.version)), 5);
}

// Bars: batches per second per 10 s bucket; line: mean commit ms.
function chart(buckets) {
  const svg = document.getElementById("chart");
  const ns = "http://www.w3.org/2000/svg";
  const width = 760, height = 180, pad = 24, slots = 30, bucketMs = 10000;
  svg.replaceChildren();
  const now = Date.now();
  const first = now - now % bucketMs - bucketMs * (slots - 1);
  const perSlot = new Array(slots).fill(null);
  for (const b of buckets) {
    const i = Math.round((b.start_ms - first) / bucketMs);
    if (i >= 0 && i < slots) perSlot[i] = b;
  }
  const rate = (b) => (b ? b.batches / (bucketMs / 1000) : 0);
  const mean = (b) => (b && b.batches ? b.commit_ms_total / b.batches : null);
  const maxRate = Math.max(0.1, ...perSlot.map(rate));
  const maxMs = Math.max(1, ...perSlot.map((b) => mean(b) || 0));
  const slotW = (width - 2 * pad) / slots;
  const y = (v, max) => height - pad - (v / max) * (height - 2 * pad);
  const points = [];
  perSlot.forEach((b, i) => {
    const x = pad + i * slotW;
    if (b) {
      const r = document.createElementNS(ns, "rect");
      r.setAttribute("class", "bars");
      r.setAttribute("x", x + 1);
      r.setAttribute("width", slotW - 2);
      r.setAttribute("y", y(rate(b), maxRate));
      r.setAttribute("height", height - pad - y(rate(b), maxRate));
      svg.appendChild(r);
      points.push(`${x + slotW / 2},${y(mean(b), maxMs)}`);
      const dot = document.createElementNS(ns, "circle");
      dot.setAttribute("class", "dot");
      dot.setAttribute("cx", x + slotW / 2);
      dot.setAttribute("cy", y(mean(b), maxMs));
      dot.setAttribute("r", 3);
      svg.appendChild(dot);
    }
  });
  if (points.length) {
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("class", "line");
    line.setAttribute("points", points.join(" "));
    svg.appendChild(line);
  }
  const axis = document.createElementNS(ns, "line");
  axis.setAttribute("x1", pad); axis.setAttribute("x2", width - pad);
  axis.setAttribute("y1", height - pad); axis.setAttribute("y2", height - pad);
  axis.setAttribute("stroke", "#8a93a3");
  svg.appendChild(axis);
  document.getElementById("chart-scale").textContent =
    `top of the chart: ${maxRate.toFixed(1)} batches/s, ${maxMs.toFixed(1)} ms; 10 s per bar`;
}

async function refresh() {
  try {
    const [status, versions] = await Promise.all([
      fetch("/v1/status").then((r) => r.json()),
      fetch("/v1/versions").then((r) => r.json()),
    ]);
    renderStatus(status);
    renderVersions(versions);
    document.getElementById("updated").textContent = new Date().toLocaleTimeString();
    document.getElementById("error").textContent = "";
    document.body.dataset.loaded = "true";
  } catch (e) {
    document.getElementById("error").textContent = "· cannot reach the host: " + e;
  }
}

refresh();
setInterval(refresh, REFRESH_MS);
