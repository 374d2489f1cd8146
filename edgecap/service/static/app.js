// The status page: polls /api/stats once a second and renders it (why polling:
// edgecap/service/http.py). Text goes in with textContent only: a caption is data.
"use strict";

const RECENT = 5;         // captions listed under the current one
const cards = new Map();  // camera name -> its DOM nodes

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
}

function num(x, digits) {
  return typeof x === "number" && isFinite(x) ? x.toFixed(digits) : "–";
}

function age(seconds) {
  if (typeof seconds !== "number") return "never";
  if (seconds < 60) return Math.round(seconds) + " s ago";
  if (seconds < 3600) return Math.round(seconds / 60) + " min ago";
  return Math.round(seconds / 3600) + " h ago";
}

function duration(seconds) {
  const s = Math.floor(seconds), d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600);
  const m = Math.floor(s % 3600 / 60);
  return "up " + (d ? d + "d " : "") + (d || h ? h + "h " : "") + m + "m " + (s % 60) + "s";
}

function card(name) {
  let c = cards.get(name);
  if (c) return c;
  const root = el("article", "camera");
  const head = el("div", "camera-head");
  const title = el("h2", null, name);
  const status = el("span", "badge");
  head.append(title, status);
  const frame = el("div", "frame");
  const img = el("img");
  img.alt = "latest frame from " + name;
  img.hidden = true;  // until a first frame loads: a camera that never sent one shows none
  frame.append(img);
  const caption = el("p", "caption", "waiting for the first caption…");
  const meta = el("p", "meta muted");
  const recent = el("ol", "recent");
  root.append(head, frame, caption, meta, recent);
  document.getElementById("cameras").append(root);
  c = {root, status, img, caption, meta, recent, seq: 0, loading: false};
  img.addEventListener("load", () => { c.loading = false; img.hidden = false; });
  img.addEventListener("error", () => { c.loading = false; });
  cards.set(name, c);
  return c;
}

function renderCamera(name, cam, captions) {
  const c = card(name);
  c.status.textContent = cam.status + (cam.reason ? ": " + cam.reason : "");
  c.status.title = c.status.textContent;  // the badge may be cut short on a phone
  c.status.className = "badge " + cam.status;
  // A new frame is fetched only when the state has one and the last has loaded.
  if (cam.frame_seq !== c.seq && !c.loading) {
    c.seq = cam.frame_seq;
    c.loading = true;
    c.img.src = "api/frame/" + encodeURIComponent(name) + ".jpg?seq=" + cam.frame_seq;
  }
  const latest = captions[0];
  c.caption.textContent = latest ? latest.text : "waiting for the first caption…";
  const p = cam.pipeline || {};
  const lat = p.latency_ms && typeof p.latency_ms === "object" ? p.latency_ms.p50 : p.latency_ms;
  c.meta.textContent = num(p.fps_in, 1) + " fps in · " + num(p.fps_out, 1) + " fps out · " +
    (p.dropped === undefined ? "–" : p.dropped) + " dropped · latency " + num(lat, 0) + " ms · caption " +
    age(cam.caption_age_s);
  c.recent.replaceChildren(...captions.slice(1, RECENT + 1).map((cap) => {
    const li = el("li");
    li.append(el("time", "muted", new Date(cap.at * 1000).toLocaleTimeString()), " ", cap.text);
    return li;
  }));
}

function renderDevices(rows) {
  const body = document.querySelector("#devices tbody");
  if (!rows.length) return;
  body.replaceChildren(...rows.map((d) => {
    const tr = el("tr");
    const busy = typeof d.busy === "number" ? Math.max(0, Math.min(1, d.busy)) : null;
    const bar = el("td", "busy");
    const meter = el("span", "meter");
    const fill = el("span", "fill");
    fill.style.width = busy === null ? "0" : (100 * busy).toFixed(0) + "%";
    meter.append(fill);
    bar.append(meter, " " + (busy === null ? "–" : (100 * busy).toFixed(0) + "%"));
    const temp = typeof d.temperature_c === "number" ? d.temperature_c.toFixed(1) + " °C" : "–";
    tr.append(el("td", null, d.device), el("td", null, d.kind || "–"), bar,
              el("td", d.throttled ? "hot" : null, temp + (d.throttled ? " throttled" : "")));
    return tr;
  }));
}

function render(snap) {
  document.getElementById("uptime").textContent = duration(snap.uptime_s);
  for (const [name, cam] of Object.entries(snap.cameras)) {
    renderCamera(name, cam, snap.captions[name] || []);
  }
  renderDevices(snap.devices || []);
}

function link(text, cls) {
  const badge = document.getElementById("link");
  badge.textContent = text;
  badge.className = "badge " + cls;
}

async function poll() {
  try {
    const r = await fetch("api/stats", {cache: "no-store"});
    if (r.status === 401) { location.href = "login"; return; }
    if (!r.ok) throw new Error("HTTP " + r.status);
    render(await r.json());
    link("live", "online");
  } catch (e) {
    link("service unreachable", "offline");
  }
  setTimeout(poll, 1000);
}

poll();
