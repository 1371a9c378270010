// The console's only script: sends the pages' changes to the operator API with the session's
// CSRF token, shows refusals beside their field, previews schedules and tails run logs.
// Plain JavaScript with no library: it is served from the binary and fetches nothing else.
"use strict";

const csrfToken = () => document.querySelector('meta[name="csrf-token"]')?.content ?? "";

async function api(method, url, body, contentType) {
  const headers = { "X-CSRF-Token": csrfToken() };
  if (body !== undefined) headers["Content-Type"] = contentType ?? "application/json";
  const init = { method, headers, credentials: "same-origin" };
  if (body !== undefined) init.body = contentType ? body : JSON.stringify(body);
  const response = await fetch(url, init);
  const text = await response.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = null; }
  return { ok: response.ok, status: response.status, data };
}

// The API says which field it refuses as the start of its message ("name: 1 to 200 characters").
function showError(scope, result) {
  scope.querySelectorAll(".error").forEach((el) => { el.textContent = ""; });
  const message = result.data?.message ?? `The request failed (HTTP ${result.status}).`;
  const field = message.split(":")[0].trim();
  let target = scope.querySelector(`[data-error-for="${CSS.escape(field)}"]`);
  if (!target && result.data?.code === "invalid_schedule") {
    target = scope.querySelector('[data-error-for="schedule_conf"]');
  }
  target = target ?? scope.querySelector('[data-error-for=""]');
  if (target) target.textContent = message;
  const input = scope.querySelector(`[name="${CSS.escape(field)}"]`);
  if (input) input.focus();
}

function fill(template, data) {
  return template.replace(/\{([\w.]+)\}/g, (_, path) =>
    path.split(".").reduce((value, key) => (value == null ? "" : value[key]), data) ?? "");
}

function formBody(form) {
  const body = {};
  for (const el of form.elements) {
    if (!el.name || el.disabled) continue;
    const type = el.dataset.type ?? "text";
    if (type === "ids" && el.multiple) {
      body[el.name] = [...el.selectedOptions].map((o) => Number(o.value));
      continue;
    }
    const value = el.value;
    if (type === "int") body[el.name] = Number(value || 0);
    else if (type === "opt-int") body[el.name] = value.trim() === "" ? null : Number(value);
    else if (type === "opt") body[el.name] = value.trim() === "" ? null : value;
    else if (type === "ids") body[el.name] = value.split(",").map((v) => v.trim()).filter(Boolean).map(Number);
    else body[el.name] = value;
  }
  return body;
}

document.addEventListener("submit", async (event) => {
  const form = event.target;
  if (form.dataset.api) {
    event.preventDefault();
    const result = await api(form.dataset.method ?? "POST", form.dataset.api, formBody(form));
    if (!result.ok) return showError(form, result);
    if (form.dataset.show) {
      // A secret shown once: on this page, never in a URL.
      document.getElementById("new-token-value").textContent = result.data[form.dataset.show];
      document.getElementById("new-token").hidden = false;
      return;
    }
    if (form.dataset.redirect) location.assign(fill(form.dataset.redirect, result.data ?? {}));
    else location.reload();
  } else if (form.dataset.upload) {
    event.preventDefault();
    const file = form.querySelector('input[type="file"]').files[0];
    if (!file) return;
    const remark = encodeURIComponent(form.querySelector('[name="remark"]')?.value ?? "");
    const result = await api("POST", `${form.dataset.upload}?remark=${remark}`, file, "application/wasm");
    if (!result.ok) return showError(form, result);
    location.reload();
  }
});

document.addEventListener("click", async (event) => {
  const button = event.target.closest("button[data-action]");
  if (!button) return;
  if (button.dataset.confirm && !confirm(button.dataset.confirm)) return;
  button.disabled = true;
  const result = await api(button.dataset.method ?? "POST", button.dataset.action);
  button.disabled = false;
  if (!result.ok) return showError(button.closest("main"), result);
  if (button.dataset.redirect) location.assign(button.dataset.redirect);
  else location.reload();
});

// The next fire times under the cron field, as the operator types.
function setUpPreview() {
  const conf = document.getElementById("schedule_conf");
  const out = document.getElementById("preview");
  if (!conf || !out || conf.closest("fieldset[disabled]")) return;
  const kind = document.getElementById("schedule_type");
  const zone = document.getElementById("time_zone");
  let timer = null;
  const update = async () => {
    const query = new URLSearchParams({ schedule_type: kind.value, schedule_conf: conf.value, time_zone: zone.value, count: "5" });
    if (kind.value === "NONE") { out.textContent = "Runs only when triggered."; return; }
    const result = await api("GET", `/api/v1/schedule/preview?${query}`);
    out.replaceChildren();
    if (!result.ok) {
      out.className = "preview error";
      out.textContent = result.data?.message ?? "cannot preview";
      return;
    }
    out.className = "preview";
    const label = document.createElement("span");
    label.textContent = "Next fires: ";
    const list = document.createElement("ol");
    for (const time of result.data.fire_times) {
      const item = document.createElement("li");
      item.textContent = time;
      list.append(item);
    }
    out.append(label, list);
  };
  const later = () => { clearTimeout(timer); timer = setTimeout(update, 250); };
  for (const el of [conf, kind, zone]) el.addEventListener("input", later);
  if (conf.value) update();
}

// The run's log, polled page by page until the run has ended and the log says it is complete.
function setUpLog() {
  const pre = document.getElementById("log");
  if (!pre) return;
  const status = document.getElementById("log-status");
  let fromLine = 1;
  const poll = async () => {
    const result = await api("GET", `/api/v1/logs/${pre.dataset.run}/content?from_line=${fromLine}`);
    if (!result.ok) {
      status.textContent = result.data?.message ?? "The log cannot be read now; trying again.";
      setTimeout(poll, 2000);
      return;
    }
    const page = result.data;
    if (page.content) pre.append(page.content.endsWith("\n") ? page.content : `${page.content}\n`);
    if (page.to_line >= fromLine) fromLine = page.to_line + 1;
    if (page.is_end) { status.textContent = "End of log."; return; }
    status.textContent = "Waiting for more…";
    setTimeout(poll, 1000);
  };
  poll();
}

setUpPreview();
setUpLog();
