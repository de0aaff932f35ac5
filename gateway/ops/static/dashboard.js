// smolgate dashboard: polls GET /v1/stats once a second and fills the page. No build step, no libraries.
// With API keys enabled the admin key (admin_keys) is typed into the page (or passed once as #key=... in the URL), kept in
// sessionStorage for this tab only, and sent as a Bearer header like any OpenAI client does.
"use strict";

const POLL_MS = 1000;
const KEY_SLOT = "smolgate-dashboard-key";
const authRequired = document.querySelector('meta[name="smolgate-auth"]').content === "required";
const statusEl = document.getElementById("status");
const authForm = document.getElementById("auth");
const keyInput = document.getElementById("key");
const history = [];  // completion tokens/s, one point per poll, for the sparkline
let timer = null;

function takeKeyFromFragment() {
  const match = /(?:^#|&)key=([^&]+)/.exec(window.location.hash);
  if (match) {
    sessionStorage.setItem(KEY_SLOT, decodeURIComponent(match[1]));
    window.history.replaceState(null, "", window.location.pathname);  // keep the key out of the address bar
  }
}

function setStatus(text, kind) {
  statusEl.textContent = text;
  statusEl.className = kind || "";
}

function lookup(obj, path) {
  return path.split(".").reduce((o, k) => (o === null || o === undefined ? undefined : o[k]), obj);
}

function format(value, how) {
  if (value === null || value === undefined) return "–";
  switch (how) {
    case "ms": return (value * 1000).toFixed(0) + " ms";
    case "percent": return (value * 100).toFixed(1) + " %";
    case "bytes": return (value / 1048576).toFixed(0) + " MiB";
    case "seconds": return value < 120 ? value.toFixed(0) + " s" : (value / 60).toFixed(0) + " min";
    default: return typeof value === "number" ? value.toLocaleString("en-US", { maximumFractionDigits: 2 }) : String(value);
  }
}

function cell(row, text, tag) {
  const el = document.createElement(tag || "td");
  el.textContent = text;  // textContent only: model names and error types come from clients
  row.appendChild(el);
}

function fillTable(id, headings, rows) {
  const table = document.getElementById(id);
  table.replaceChildren();
  const head = table.insertRow();
  headings.forEach((h) => cell(head, h, "th"));
  rows.forEach((r) => {
    const row = table.insertRow();
    r.forEach((v) => cell(row, v));
  });
}

function trafficRows(table) {
  return Object.entries(table || {})
    .sort((a, b) => b[1].requests - a[1].requests)
    .map(([name, t]) => [name, format(t.requests), format(t.errors), format(t.prompt_tokens), format(t.completion_tokens)]);
}

function drawSparkline() {
  const canvas = document.getElementById("spark");
  const ctx = canvas.getContext("2d");
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  const top = Math.max(1, ...history);
  ctx.strokeStyle = "#4fc3f7";
  ctx.beginPath();
  history.forEach((v, i) => {
    const x = (i / 119) * canvas.width;
    const y = canvas.height - 2 - (v / top) * (canvas.height - 4);
    if (i === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
  });
  ctx.stroke();
}

function render(stats) {
  document.querySelectorAll("[data-stat]").forEach((el) => {
    el.textContent = format(lookup(stats, el.dataset.stat), el.dataset.format);
  });
  const heads = ["", "requests", "errors", "prompt tokens", "completion tokens"];
  fillTable("models", heads, trafficRows(stats.models));
  fillTable("keys", heads, trafficRows(stats.keys));
  fillTable("errors", ["time", "status", "error", "path", "model", "request id"], stats.recent_errors.map((e) => [
    new Date(e.time * 1000).toLocaleTimeString(), String(e.status), e.error, e.path, e.model, e.request_id,
  ]));
  history.push(lookup(stats, "requests.completion_tokens_per_s") || 0);
  if (history.length > 120) history.shift();
  drawSparkline();
}

function askForKey(message) {
  clearTimeout(timer);
  setStatus(message, "bad");
  authForm.classList.add("shown");
  keyInput.focus();
}

async function poll() {
  const key = sessionStorage.getItem(KEY_SLOT);
  if (authRequired && !key) {
    askForKey("admin key required");
    return;
  }
  try {
    const resp = await fetch("/v1/stats", { headers: key ? { Authorization: "Bearer " + key } : {}, cache: "no-store" });
    if (resp.status === 401) {
      sessionStorage.removeItem(KEY_SLOT);
      askForKey("admin key rejected");
      return;
    }
    if (!resp.ok) throw new Error("HTTP " + resp.status);
    render(await resp.json());
    setStatus("live · updated " + new Date().toLocaleTimeString(), "ok");
  } catch (err) {
    setStatus("cannot reach the gateway (" + err.message + "), retrying", "bad");
  }
  timer = setTimeout(poll, POLL_MS);
}

authForm.addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(KEY_SLOT, keyInput.value.trim());
  keyInput.value = "";
  authForm.classList.remove("shown");
  setStatus("connecting…");
  poll();
});

takeKeyFromFragment();
poll();
