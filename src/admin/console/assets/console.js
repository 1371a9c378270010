// The console's only script: sends the pages' changes to the operator API with the session's
// CSRF token, shows refusals beside their field, previews schedules, tails run logs over
// Server-Sent Events, edits GLUE source and shows version diffs.
// Plain JavaScript with no library: it is served from the binary and fetches nothing else.
// Its texts come with the page (the `i18n` JSON, in the page's language): `t("key")`.
"use strict";

const texts = JSON.parse(document.getElementById("i18n")?.textContent || "{}");

// The text of `key` with each `{name}` replaced by `values[name]`.
function t(key, values = {}) {
  const text = texts[key] ?? key;
  return text.replace(/\{(\w+)\}/g, (whole, name) => (name in values ? String(values[name]) : whole));
}

const csrfToken = () => document.querySelector('meta[name="csrf-token"]')?.content ?? "";

// Calls the API; the answer's JSON (or, for a text answer, its text) and status.
async function api(method, url, body, contentType) {
  const headers = { "X-CSRF-Token": csrfToken() };
  if (body !== undefined) headers["Content-Type"] = contentType ?? "application/json";
  const init = { method, headers, credentials: "same-origin" };
  if (body !== undefined) init.body = contentType ? body : JSON.stringify(body);
  let response;
  try {
    response = await fetch(url, init);
  } catch {
    return { ok: false, status: 0, data: { message: t("offline") }, text: "" };
  }
  const text = await response.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = null; }
  return { ok: response.ok, status: response.status, data, text };
}

// The API says which field it refuses as the start of its message ("name: 1 to 200 characters").
function showError(scope, result) {
  scope.querySelectorAll(".error").forEach((el) => { el.textContent = ""; });
  const message = result.data?.message ?? t("request_failed", { status: result.status });
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
    // A whole JSON document (a workflow's): its fields are the body's.
    if (type === "document") { Object.assign(body, JSON.parse(value)); continue; }
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
    let body;
    try {
      body = formBody(form);
    } catch (error) {
      return showError(form, { data: { message: t("document_invalid", { error: error.message }) } });
    }
    const result = await api(form.dataset.method ?? "POST", form.dataset.api, body);
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
  const switcher = event.target.closest("button[data-lang]");
  if (switcher) {
    // The language switch: a cookie the server reads before the browser's Accept-Language.
    document.cookie = `lang=${switcher.dataset.lang}; Path=/; Max-Age=31536000; SameSite=Strict`;
    location.reload();
    return;
  }
  const button = event.target.closest("button[data-action]");
  if (!button) return;
  if (button.dataset.confirm && !confirm(button.dataset.confirm)) return;
  button.disabled = true;
  const result = await api(button.dataset.method ?? "POST", button.dataset.action);
  button.disabled = false;
  if (!result.ok) return showError(button.closest("main"), result);
  if ("noReload" in button.dataset) {
    // A kill: the log tail shows the run's end when it comes.
    button.closest("p").replaceChildren(t("kill_sent"));
    return;
  }
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
    if (kind.value === "NONE") { out.textContent = t("preview_none"); return; }
    const result = await api("GET", `/api/v1/schedule/preview?${query}`);
    out.replaceChildren();
    if (!result.ok) {
      out.className = "preview error";
      out.textContent = result.data?.message ?? t("preview_failed");
      return;
    }
    out.className = "preview";
    const label = document.createElement("span");
    label.textContent = t("next_fires");
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

// The run's log, followed live over Server-Sent Events (`/api/v1/logs/{id}/stream`): each
// line is an event whose id is its number, then an `end` event carries the result. If the stream
// fails before its first event (an old admin, a proxy that buffers), the log is polled instead.
function setUpLog() {
  const pre = document.getElementById("log");
  if (!pre) return;
  const status = document.getElementById("log-status");
  const run = pre.dataset.run;
  const append = (text) => pre.append(text.endsWith("\n") ? text : `${text}\n`);
  const showEnd = (end) => {
    const state = document.getElementById("run-state");
    state.textContent = t(`state.${end.state}`);
    state.className = `state state-${end.state}`;
    document.getElementById("run-result").textContent = `${end.handle_code} ${end.handle_msg}`;
    document.getElementById("kill")?.remove();
    status.textContent = t("log_end");
  };
  if (typeof EventSource === "undefined") return poll(1);
  pre.dataset.tail = "stream";
  let heard = false;
  const source = new EventSource(`/api/v1/logs/${run}/stream`);
  status.textContent = t("log_live");
  source.onmessage = (event) => { heard = true; append(event.data); };
  source.addEventListener("end", (event) => {
    heard = true;
    source.close();
    let end = null;
    try { end = JSON.parse(event.data); } catch { end = null; }
    if (end) showEnd(end); else status.textContent = t("log_end");
  });
  source.onerror = () => {
    // After the first event the browser reconnects by itself, resuming with Last-Event-ID.
    if (heard) { status.textContent = t("log_reconnecting"); return; }
    source.close();
    poll(1);
  };

  // Page by page until the run has ended and the log says it is complete.
  async function poll(fromLine) {
    pre.dataset.tail = "poll";
    const result = await api("GET", `/api/v1/logs/${run}/content?from_line=${fromLine}`);
    if (!result.ok) {
      status.textContent = result.data?.message ?? t("log_retry");
      setTimeout(() => poll(fromLine), 2000);
      return;
    }
    const page = result.data;
    if (page.content) append(page.content);
    const next = page.to_line >= fromLine ? page.to_line + 1 : fromLine;
    if (page.is_end) {
      const record = await api("GET", `/api/v1/logs/${run}`);
      if (record.ok) showEnd(record.data); else status.textContent = t("log_end");
      return;
    }
    status.textContent = t("log_waiting");
    setTimeout(() => poll(next), 1000);
  }
}

// The versions page: what the API says of each version (its language, whether it has source)
// adds the source actions, fills the editor with the active version's source, and offers a
// diff between two versions with source. Versions without source offer none of that.
async function setUpVersions() {
  const page = document.getElementById("versions-page");
  if (!page) return;
  const listed = await api("GET", page.dataset.api);
  if (!listed.ok) return;
  const versions = Array.isArray(listed.data) ? listed.data : (listed.data?.items ?? []);
  const withSource = versions.filter((v) => v.has_source === true).sort((a, b) => b.version - a.version);
  for (const v of versions) {
    const row = document.querySelector(`#versions tr[data-version="${Number(v.version)}"]`);
    if (!row) continue;
    if (v.language) row.querySelector(".language").textContent = v.language;
    if (v.has_source !== true) continue;
    const view = document.createElement("button");
    view.type = "button";
    view.className = "secondary";
    view.textContent = t("view_source");
    view.setAttribute("aria-label", t("view_source_of", { version: v.version }));
    view.addEventListener("click", () => showSource(v.version));
    row.querySelector(".row-actions").append(" ", view);
  }
  const editor = document.getElementById("source");
  const active = withSource.find((v) => v.active);
  if (editor && active && editor.value === "") {
    const source = await sourceOf(active.version);
    if (source !== null) editor.value = source;
  }
  if (withSource.length >= 2) {
    const from = document.getElementById("diff-from");
    const to = document.getElementById("diff-to");
    for (const v of withSource) {
      from.append(new Option(t("version_n", { version: v.version }), v.version));
      to.append(new Option(t("version_n", { version: v.version }), v.version));
    }
    // By default, the newest against the one before it.
    from.selectedIndex = 1;
    to.selectedIndex = 0;
    document.getElementById("diff-section").hidden = false;
  }

  async function sourceOf(version) {
    const result = await api("GET", `${page.dataset.api}/${version}/source`);
    return result.ok ? result.text : null;
  }

  async function showSource(version) {
    const section = document.getElementById("source-view-section");
    const view = document.getElementById("source-view");
    document.getElementById("source-view-title").textContent = t("source_of", { version });
    const source = await sourceOf(version);
    view.textContent = source ?? t("source_missing");
    section.hidden = false;
    view.focus();
  }
}

document.addEventListener("submit", async (event) => {
  const form = event.target;
  if (form.id === "diff-form") {
    event.preventDefault();
    const page = document.getElementById("versions-page");
    const from = form.elements.from.value;
    const to = form.elements.to.value;
    const result = await api("GET", `${page.dataset.api}/${from}/diff/${to}`);
    if (!result.ok) return showError(form, result);
    const out = document.getElementById("diff");
    out.replaceChildren();
    const lines = result.text.split("\n");
    if (lines.at(-1) === "") lines.pop();
    for (const line of lines) {
      const span = document.createElement("span");
      if (line.startsWith("+++") || line.startsWith("---")) span.className = "file";
      else if (line.startsWith("@@")) span.className = "hunk";
      else if (line.startsWith("+")) span.className = "added";
      else if (line.startsWith("-")) span.className = "removed";
      span.textContent = `${line}\n`;
      out.append(span);
    }
    if (lines.length === 0) out.textContent = t("diff_empty");
    out.hidden = false;
  } else if (form.dataset.source) {
    // GLUE source: the text is the body, its language the content type; the API builds it and
    // answers like an upload, or with the builder's error, shown as text beside the editor.
    event.preventDefault();
    const button = form.querySelector('button[type="submit"]');
    const remark = encodeURIComponent(form.elements.remark.value);
    button.disabled = true;
    const result = await api("POST", `${form.dataset.source}?remark=${remark}`, form.elements.source.value, form.dataset.contentType);
    button.disabled = false;
    if (!result.ok) {
      const error = form.querySelector(".build-error");
      error.textContent = result.data?.message ?? t("request_failed", { status: result.status });
      error.focus();
      return;
    }
    location.reload();
  }
});

setUpPreview();
setUpLog();
setUpVersions();
