// The status page: polls /api/stats once a second and renders it (why polling:
// edgecap/service/http.py). Where the service keeps a history, each camera's
// event timeline also reads /api/events every few seconds and the search box
// asks it on submit. Text goes in with textContent only: a caption is data.
"use strict";

const RECENT = 5;            // captions listed under "Last captions"
const TIMELINE = 6;          // events on each camera's timeline
const TIMELINE_EVERY_MS = 5000;
const SEARCH_LIMIT = 50;
const API_EVENTS = new URL("api/events", location.href);  // event thumbnail URLs are relative to it
const cards = new Map();     // camera name -> its DOM nodes and events
const form = document.getElementById("search-form");  // there when the service keeps a history
let started = false;         // the timelines' refresh from the history, after the first snapshot

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

function lasted(seconds) {
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return s + " s";
  if (s < 3600) return Math.floor(s / 60) + " min " + (s % 60) + " s";
  return Math.floor(s / 3600) + " h " + Math.floor(s % 3600 / 60) + " min";
}

function when(t) {  // the time of day, with the date when not today
  const d = new Date(t * 1000);
  return d.toDateString() === new Date().toDateString() ? d.toLocaleTimeString() : d.toLocaleString();
}

function thumbnailUrl(ev) {
  // From the history, `thumbnail` is its address; from the state, `has_thumbnail` says there is one.
  // Made here from the id either way, so that the same event has the same address from both; an
  // open event's picture changes with its confidence: a new address then.
  if (!ev.thumbnail && !ev.has_thumbnail) return null;
  return new URL("events/" + encodeURIComponent(ev.id) + "/thumbnail.jpg?c=" + ev.confidence, API_EVENTS).href;
}

// One event as a list item; `images` holds the last render's <img> by address, moved
// rather than made again so that a refresh fetches no thumbnail twice.
function eventItem(ev, withCamera, images) {
  const li = el("li", "event");
  const box = el("span", "thumb");
  const src = thumbnailUrl(ev);
  if (src) {
    let img = images && images.get(src);
    if (!img) {
      img = el("img");
      img.alt = "";  // the text beside it says what it shows
      img.addEventListener("error", () => { img.hidden = true; });
      img.src = src;
    }
    box.append(img);
  }
  const body = el("div", "event-body");
  const meta = el("p", "when muted");
  if (withCamera) meta.append(el("strong", null, ev.camera), " · ");
  const time = el("time", null, when(ev.start_time));
  time.dateTime = new Date(ev.start_time * 1000).toISOString();
  meta.append(time, " · " + lasted(ev.end_time - ev.start_time) + (ev.closed ? "" : " so far"));
  if (!ev.closed) meta.append(" ", el("span", "badge online", "now"));
  body.append(meta, el("p", "event-text", ev.text));
  li.append(box, body);
  return li;
}

function imagesIn(list) {
  return new Map([...list.querySelectorAll("img")].map((img) => [img.getAttribute("src"), img]));
}

function card(name) {
  let c = cards.get(name);
  if (c) return c;
  const root = el("article", "camera");
  root.setAttribute("aria-label", "camera " + name);
  const head = el("div", "camera-head");
  const status = el("span", "badge");
  head.append(el("h2", null, name), status);
  const frame = el("figure", "frame");
  const img = el("img");
  img.alt = "latest frame from " + name;
  img.hidden = true;  // until a first frame loads: a camera that never sent one shows none
  const caption = el("figcaption", "caption", "waiting for the first caption…");
  frame.append(img, caption);
  const conf = el("p", "confidence");
  const meter = el("span", "meter");
  meter.setAttribute("role", "meter");
  meter.setAttribute("aria-label", "confidence of the caption");
  meter.setAttribute("aria-valuemin", "0");
  meter.setAttribute("aria-valuemax", "100");
  const fill = el("span", "fill");
  meter.append(fill);
  const confText = el("span", null, "–");
  conf.append(el("span", "muted", "confidence "), meter, " ", confText);
  const meta = el("p", "meta muted");
  const timeline = el("ol", "events timeline");
  timeline.setAttribute("aria-label", "events of " + name);
  const more = el("details", "recent-box");
  const recent = el("ol", "recent");
  more.append(el("summary", null, "Last captions"), recent);
  root.append(head, frame, conf, meta, el("h3", null, "Events"), timeline, more);
  document.getElementById("cameras").append(root);
  c = {root, status, img, caption, meter, fill, confText, meta, timeline, recent, seq: 0, loading: false,
       current: null, recentEvents: [], history: [], shown: null};
  img.addEventListener("load", () => { c.loading = false; img.hidden = false; });
  img.addEventListener("error", () => { c.loading = false; });
  cards.set(name, c);
  const select = document.getElementById("search-camera");
  if (select) select.append(new Option(name, name));
  return c;
}

function renderConfidence(c, cap) {
  // Caption.confidence is a mean log-probability (<= 0); its exponent, the
  // per-token geometric mean probability, reads as a share.
  const ok = cap && typeof cap.confidence === "number" && isFinite(cap.confidence);
  const share = ok ? Math.exp(Math.min(0, cap.confidence)) : 0;
  const percent = Math.round(100 * share);
  c.fill.style.width = percent + "%";
  c.meter.setAttribute("aria-valuenow", String(percent));
  c.confText.textContent = ok ? percent + "%" : "–";
  c.confText.title = ok ? "mean log-probability per token " + cap.confidence.toFixed(3) : "";
}

function renderTimeline(c) {
  // The event in progress, the history's latest and the state's recent ones, newest first, once each.
  const seen = new Set(), events = [];
  for (const ev of [c.current, ...c.history, ...c.recentEvents]) {
    if (ev && !seen.has(ev.id)) { seen.add(ev.id); events.push(ev); }
  }
  events.sort((a, b) => b.start_time - a.start_time);
  const shown = JSON.stringify(events.slice(0, TIMELINE));
  if (shown === c.shown) return;
  c.shown = shown;
  const images = imagesIn(c.timeline);
  c.timeline.replaceChildren(...(events.length ? events.slice(0, TIMELINE).map((ev) => eventItem(ev, false, images))
    : [el("li", "muted", "no event yet")]));
}

function renderCamera(name, cam, captions, events) {
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
  if (latest && latest.scene === "unknown") c.caption.append(" ", el("span", "scene", "(unknown scene)"));
  renderConfidence(c, latest);
  const p = cam.pipeline || {};
  const lat = p.latency_ms && typeof p.latency_ms === "object" ? p.latency_ms.p50 : p.latency_ms;
  c.meta.textContent = num(p.fps_in, 1) + " fps in · " + num(p.fps_out, 1) + " fps out · " +
    (p.dropped === undefined ? "–" : p.dropped) + " dropped · latency " + num(lat, 0) + " ms · caption " +
    age(cam.caption_age_s);
  c.recent.replaceChildren(...captions.slice(1, RECENT + 1).map((cap) => {
    const li = el("li");
    li.append(el("time", "muted", new Date(cap.at * 1000).toLocaleTimeString()), " ", cap.text);
    if (cap.scene === "unknown") li.append(" ", el("span", "scene", "(unknown scene)"));
    return li;
  }));
  c.current = events.current || null;
  c.recentEvents = events.recent || [];
  renderTimeline(c);
}

// The plan's and the measured milliseconds a frame of a device's steps, and what the board learned.
function stepTimes(d) {
  const ms = (v) => (typeof v === "number" ? v.toFixed(2) : "–");
  const off = typeof d.predicted_ms === "number" && typeof d.measured_ms === "number" &&
              d.measured_ms > 1.1 * d.predicted_ms;
  const learned = typeof d.compute_scale === "number" && d.compute_scale !== 1
    ? ` (learned ×${d.compute_scale.toFixed(2)})` : "";
  return el("td", off ? "hot" : null, `${ms(d.predicted_ms)} / ${ms(d.measured_ms)} ms${learned}`);
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
              el("td", d.throttled ? "hot" : null, temp + (d.throttled ? " throttled" : "")),
              stepTimes(d));
    return tr;
  }));
}

function renderSinks(sinks) {
  const names = Object.keys(sinks);
  if (!names.length) return;
  document.querySelector("#sinks tbody").replaceChildren(...names.map((name) => {
    const s = sinks[name];
    const tr = el("tr");
    tr.append(el("td", null, name + (s.connected === false ? " (not connected)" : "")),
              el("td", null, String(s.sent ?? 0)),
              el("td", s.waiting ? "hot" : null, typeof s.waiting === "number" ? String(s.waiting) : "–"),
              el("td", s.dropped ? "hot" : null, String(s.dropped ?? 0)),
              el("td", s.errors ? "hot" : null, String(s.errors ?? 0)));
    return tr;
  }));
}

// What the model knows, when that is worth a warning (a synthetic world, no calibration): one line.
function renderModel(model) {
  const notice = document.getElementById("model-notice");
  const lines = model && Array.isArray(model.notices) ? model.notices : [];
  notice.textContent = lines.map((line) => line.replace(/^edgecap: /, "")).join(" ");
  notice.hidden = !lines.length;
}

function render(snap) {
  document.getElementById("uptime").textContent = duration(snap.uptime_s);
  renderModel(snap.model);
  const events = snap.events || {};  // per camera: {current, recent}, where the service tracks events
  for (const [name, cam] of Object.entries(snap.cameras)) {
    renderCamera(name, cam, snap.captions[name] || [], events[name] || {});
  }
  renderDevices(snap.devices || []);
  renderSinks(snap.sinks || {});
}

function link(text, cls) {
  const badge = document.getElementById("link");
  badge.textContent = text;
  badge.className = "badge " + cls;
}

async function events(params) {
  const r = await fetch("api/events?" + new URLSearchParams(params), {cache: "no-store"});
  if (r.status === 401) { location.href = "login"; return []; }
  const body = await r.json();
  if (!r.ok) throw new Error(body.error || "HTTP " + r.status);
  return body.events;
}

async function timelines() {
  await Promise.all([...cards].map(async ([name, c]) => {
    try {
      c.history = await events({camera: name, limit: TIMELINE});
      renderTimeline(c);
    } catch (e) {
      // The stats poll tells when the service is unreachable; the timeline keeps what it had.
    }
  }));
  setTimeout(timelines, TIMELINE_EVERY_MS);
}

async function search(form) {
  const params = new URLSearchParams(new FormData(form));
  params.set("limit", SEARCH_LIMIT);
  const status = document.getElementById("search-status");
  const results = document.getElementById("results");
  status.textContent = "searching…";
  try {
    const found = await events(params);
    results.replaceChildren(...found.map((ev) => eventItem(ev, true)));
    const q = params.get("q").trim();
    status.textContent = (found.length === 1 ? "1 event" : found.length + " events") +
      (q ? " for " + q : "") + (found.length === SEARCH_LIMIT ? ", the newest " + SEARCH_LIMIT : "");
  } catch (e) {
    results.replaceChildren();
    status.textContent = "Search failed: " + e.message;
  }
}

async function poll() {
  try {
    const r = await fetch("api/stats", {cache: "no-store"});
    if (r.status === 401) { location.href = "login"; return; }
    if (!r.ok) throw new Error("HTTP " + r.status);
    render(await r.json());
    link("live", "online");
    if (form && !started) { started = true; timelines(); }
  } catch (e) {
    link("service unreachable", "offline");
  }
  setTimeout(poll, 1000);
}

if (form) form.addEventListener("submit", (e) => { e.preventDefault(); search(form); });
poll();
