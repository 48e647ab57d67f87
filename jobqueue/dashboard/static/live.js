// Live updates from the queues' event logs (server-sent events, /events/stream). The events
// page gets each event as a new row; every other page is read again (at most once a second)
// when an event comes and its <main> swapped in. Without this script every page still works.
"use strict";
(function () {
  // Times written <time datetime="..."> in UTC are shown in the browser's own zone (UTC
  // stays in the tooltip); the server cannot know the reader's zone.
  function localTimes(within) {
    for (const el of within.querySelectorAll("time[datetime]")) {
      const at = new Date(el.getAttribute("datetime"));
      if (isNaN(at)) continue;
      if (!el.title) el.title = el.textContent;
      const pad = (n) => String(n).padStart(2, "0");
      const zone = Intl.DateTimeFormat().resolvedOptions().timeZone || "local";
      el.textContent = at.getFullYear() + "-" + pad(at.getMonth() + 1) + "-" +
        pad(at.getDate()) + " " + pad(at.getHours()) + ":" + pad(at.getMinutes()) + ":" +
        pad(at.getSeconds()) + " " + zone;
    }
  }
  localTimes(document);
  const main = document.querySelector("main[data-live]");
  if (!main || !window.EventSource) return;
  const badge = document.getElementById("live");
  const table = document.querySelector("table#events tbody");
  const root = (document.querySelector("table#events") || main).dataset.root || "";
  const source = new EventSource(main.dataset.live);
  let pending = null, last = 0;
  source.onopen = () => { if (badge) badge.hidden = false; };
  source.onerror = () => { if (badge) badge.hidden = true; };
  source.onmessage = (message) => {
    let ev;
    try { ev = JSON.parse(message.data); } catch (e) { return; }
    if (table) { addRow(ev); return; }
    if (pending) return;
    pending = setTimeout(refresh, Math.max(0, 1000 - (Date.now() - last)));
  };
  function cell(row, text) { const td = row.insertCell(); td.textContent = text; return td; }
  function addRow(ev) {
    const row = table.insertRow(0);
    row.className = "event-" + ev.kind;
    cell(row, new Date(ev.at_ms).toISOString().replace("T", " ").replace("Z", ""));
    cell(row, ev.queue + "#" + ev.partition);
    cell(row, ev.kind);
    const link = document.createElement("a");
    link.href = root + "/run?id=" + encodeURIComponent(ev.run_id) +
      "&queue=" + encodeURIComponent(ev.queue);
    link.textContent = ev.run_id;
    row.insertCell().appendChild(link);
    const detail = [];
    if (ev.attempt !== undefined) detail.push("attempt " + ev.attempt);
    if (ev.worker) detail.push("by " + ev.worker);
    if (ev.progress !== undefined) detail.push(ev.progress + "%");
    if (ev.text) detail.push(ev.text);
    cell(row, detail.join(" "));
    const empty = document.getElementById("no-events");
    if (empty) empty.remove();
    while (table.rows.length > 1000) table.deleteRow(-1);
  }
  async function refresh() {
    pending = null;
    last = Date.now();
    try {
      const response = await fetch(location.href, {credentials: "same-origin"});
      if (!response.ok) return;
      const page = new DOMParser().parseFromString(await response.text(), "text/html");
      const fresh = page.querySelector("main");
      if (fresh) { main.replaceChildren(...fresh.childNodes); localTimes(main); }
    } catch (e) { /* the next event tries again */ }
  }
})();
