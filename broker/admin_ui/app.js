// plugbroker's management web UI: plain JavaScript, no build step, no library.
// Every figure comes from the admin API (docs/admin.md) with the user's HTTP Basic login;
// the API decides what the user may see and do, the page only hides buttons it would refuse.
// Data is put in the page with textContent only: a queue or consumer name is never HTML.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const KEY = "plugbroker.auth";
  const REFRESH_MS = 5000;
  let auth = sessionStorage.getItem(KEY);
  let me = null;
  let timer = null;
  let armed = 0; // buttons waiting for their confirming click: no refresh meanwhile

  // ------------------------------------------------------------------ DOM helpers

  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === "class") e.className = v;
      else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children.flat()) {
      if (c === undefined || c === null) continue;
      e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }

  function table(headings, rows, cls) {
    return el(
      "table",
      { class: cls || "" },
      el("thead", {}, el("tr", {}, headings.map((h) => el("th", {}, h)))),
      el("tbody", {}, rows)
    );
  }

  const SVG = "http://www.w3.org/2000/svg";

  // A sparkline: the values as a line over a fixed box, the latest value beside it.
  function spark(values, { width = 120, height = 24, unit = "", cls = "" } = {}) {
    const svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("width", width);
    svg.setAttribute("height", height);
    svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
    svg.setAttribute("class", "spark " + cls);
    const vals = values.length ? values : [0];
    const max = Math.max(...vals, 1e-9);
    const step = vals.length > 1 ? width / (vals.length - 1) : width;
    const pts = vals.map((v, i) => {
      const x = vals.length > 1 ? i * step : width;
      const y = height - 2 - (v / max) * (height - 4);
      return `${x.toFixed(1)},${y.toFixed(1)}`;
    });
    const line = document.createElementNS(SVG, "polyline");
    line.setAttribute("points", pts.join(" "));
    svg.append(line);
    const title = document.createElementNS(SVG, "title");
    title.textContent = `last ${vals.length} samples, max ${fmt(max)}${unit}`;
    svg.append(title);
    const last = vals[vals.length - 1];
    return el("span", { class: "sparkcell" }, svg, el("span", { class: "last" }, fmt(last) + unit));
  }

  function fmt(v) {
    if (typeof v !== "number") return v === null || v === undefined ? "-" : String(v);
    return Number.isInteger(v) ? String(v) : v.toFixed(v < 10 ? 2 : 1);
  }

  function kv(obj) {
    const pairs = Object.entries(obj || {});
    return pairs.length ? pairs.map(([k, v]) => `${k}=${v}`).join(", ") : "-";
  }

  function status(text, error) {
    const s = $("status");
    s.textContent = text;
    s.className = "status" + (error ? " error" : " ok");
  }

  // ------------------------------------------------------------------ the API

  function basic(user, password) {
    const bytes = new TextEncoder().encode(`${user}:${password}`);
    let bin = "";
    for (const b of bytes) bin += String.fromCharCode(b);
    return btoa(bin);
  }

  async function api(method, path) {
    const resp = await fetch(path, {
      method,
      headers: { Authorization: "Basic " + auth, "X-Plugbroker-UI": "1" },
      cache: "no-store",
    });
    const text = await resp.text();
    let body = text;
    try {
      body = JSON.parse(text);
    } catch (e) {
      /* not JSON: keep the text */
    }
    if (!resp.ok) {
      const msg =
        body && body.error ? body.error + (body.reason ? ": " + body.reason : "") : text;
      const err = new Error(`${resp.status} ${msg}`);
      err.status = resp.status;
      throw err;
    }
    return body;
  }

  const enc = encodeURIComponent;
  const qpath = (q) => `/api/queues/${enc(q.vhost)}/${enc(q.name || q.queue)}`;

  // A button that acts on its second click ("Purge" -> "Confirm purge?") so one slip does
  // not purge a queue; the first click arms it for a few seconds.
  function actButton(label, attrs, run) {
    const b = el("button", Object.assign({ type: "button", class: "act" }, attrs), label);
    let timeout = null;
    b.addEventListener("click", async () => {
      if (!b.classList.contains("armed")) {
        b.classList.add("armed");
        b.textContent = `Confirm ${label.toLowerCase()}?`;
        armed += 1;
        timeout = setTimeout(() => {
          b.classList.remove("armed");
          b.textContent = label;
          armed -= 1;
        }, 6000);
        return;
      }
      clearTimeout(timeout);
      armed -= 1;
      b.disabled = true;
      try {
        status(await run(), false);
      } catch (e) {
        status(e.message, true);
      }
      render();
    });
    return b;
  }

  // A button that acts at once (reads, dry runs).
  function button(label, attrs, run) {
    return el("button", Object.assign({ type: "button", onclick: run }, attrs), label);
  }

  // ------------------------------------------------------------------ pages

  const may = {
    act: (vhost) => me && (me.administrator || me.vhosts.includes(vhost)),
    close: (c) => me && (me.administrator || (c.user === me.name && me.vhosts.includes(c.vhost))),
  };

  async function overview() {
    const [o, h] = await Promise.all([api("GET", "/api/overview"), api("GET", "/api/history")]);
    const broker = h.broker || {
      messages: sumSeries(h.queues, "messages"),
      connections: [],
      ack_rate: [],
    };
    const card = (label, value, cls, id) =>
      el("div", { class: "card " + (cls || ""), id }, el("div", { class: "label" }, label),
        el("div", { class: "value" }, fmt(value)));
    return [
      el("h1", {}, "Overview"),
      el("p", { class: "muted" }, `${o.product} ${o.version} · vhosts ${o.vhosts.join(", ")}`),
      el("div", { class: "cards" },
        card("Connections", o.connections, "", "ov-connections"),
        card("Queues", o.queues, "", "ov-queues"),
        card("Messages", o.messages, "", "ov-messages"),
        card("Consumers", o.consumers, "", "ov-consumers"),
        card("Isolated", o.isolated, o.isolated ? "warn" : "", "ov-isolated"),
        card("Delayed", o.delayed_pending, "", "ov-delayed"),
        card("Alarm", o.alarm || "none", o.alarm ? "alarm" : "", "ov-alarm")),
      el("h2", {}, "Message rates"),
      el("div", { class: "charts" },
        chart("Acked / s", broker.ack_rate, "/s"),
        chart("Messages held", broker.messages, ""),
        chart("Connections", broker.connections, "")),
      el("p", { class: "muted" },
        "One sample every few seconds (the last 120 are kept). Plugins: " + o.plugins.join(", ")),
    ];
  }

  function chart(label, values, unit) {
    return el("div", { class: "chart" }, el("div", { class: "label" }, label),
      values && values.length ? spark(values, { width: 280, height: 60, unit }) : el("span", { class: "muted" }, "no samples yet"));
  }

  function sumSeries(queues, field) {
    const n = Math.max(0, ...queues.map((q) => q[field].length));
    const out = new Array(n).fill(0);
    for (const q of queues) {
      const s = q[field];
      for (let i = 0; i < s.length; i++) out[n - s.length + i] += s[i];
    }
    return out;
  }

  async function queues() {
    const [qs, h] = await Promise.all([api("GET", "/api/queues"), api("GET", "/api/history")]);
    const hist = new Map(h.queues.map((r) => [`${r.vhost}\u0000${r.name}`, r]));
    const rows = qs.map((q) => {
      const r = hist.get(`${q.vhost}\u0000${q.name}`) || { messages: [], oldest_age_s: [] };
      const policy = Object.entries(q.policy);
      const acts = may.act(q.vhost)
        ? [
            actButton("Purge", { "data-action": "purge", "data-queue": q.name, "data-vhost": q.vhost },
              async () => `Purged ${(await api("POST", qpath(q) + "/purge")).purged} messages from ${q.name}`),
            actButton("Delete", { "data-action": "delete", "data-queue": q.name, "data-vhost": q.vhost, class: "act danger" },
              async () => { await api("POST", qpath(q) + "/delete"); return `Deleted queue ${q.name}`; }),
          ]
        : [];
      return el("tr", { "data-queue": q.name },
        el("td", {}, q.vhost), el("td", { class: "name" }, q.name),
        el("td", { class: "num", "data-field": "messages" }, q.messages),
        el("td", { class: "num" }, q.ready), el("td", { class: "num" }, q.unacked),
        el("td", { class: "num" }, q.consumers),
        el("td", {}, spark(r.messages.concat([q.messages]))),
        el("td", {}, spark(r.oldest_age_s.concat([q.oldest_age_s]), { unit: " s" })),
        el("td", { class: "policy" }, policy.length
          ? policy.map(([k, src]) => el("span", { class: "tag", title: src }, k))
          : el("span", { class: "muted" }, "none")),
        el("td", { class: "actions" }, acts));
    });
    return [
      el("h1", {}, "Queues"),
      qs.length ? table(["vhost", "name", "messages", "ready", "unacked", "consumers", "backlog", "oldest age", "policy in force", ""], rows, "queues")
        : el("p", { class: "muted" }, "No queues."),
    ];
  }

  async function consumers() {
    const cs = await api("GET", "/api/consumers");
    const rows = cs.map((c) => {
      const cls = c.isolated ? "isolated" : c.timed_out_age_s != null ? "poison" : "";
      const q = { vhost: c.vhost, name: c.queue };
      const base = `/api/consumers/${enc(c.vhost)}/${enc(c.queue)}/${enc(c.tag)}`;
      const qs = "?connection=" + enc(c.connection);
      const acts = [];
      if (may.act(c.vhost)) {
        if (c.isolated)
          acts.push(actButton("Release", { "data-action": "release", "data-tag": c.tag },
            async () => { await api("POST", base + "/release" + qs); return `Released ${c.tag}`; }));
        acts.push(actButton("Cancel", { "data-action": "cancel", "data-tag": c.tag, class: "act danger" },
          async () => { await api("POST", base + "/cancel" + qs); return `Cancelled ${c.tag}`; }));
      }
      const state = c.isolated ? "isolated" : c.timed_out_age_s != null ? `over its ack timeout (counted ${c.timed_out_age_s} s ago)` : "ok";
      return el("tr", { class: cls, "data-tag": c.tag },
        el("td", {}, q.vhost), el("td", {}, c.queue), el("td", { class: "name" }, c.tag),
        el("td", {}, c.connection), el("td", { class: "num" }, c.channel),
        el("td", { class: "num" }, c.unacked), el("td", { class: "num" }, c.prefetch),
        el("td", { class: "num" }, c.delivered), el("td", { class: "num" }, fmt(c.last_ack_age_s)),
        el("td", { class: "state" }, state), el("td", { class: "actions" }, acts));
    });
    return [
      el("h1", {}, "Consumers"),
      el("p", { class: "muted" }, "Isolated consumers (ack-timeout isolation) and those over their ack timeout that the cap spares are highlighted."),
      cs.length ? table(["vhost", "queue", "tag", "connection", "channel", "unacked", "prefetch", "delivered", "last ack (s)", "state", ""], rows, "consumers")
        : el("p", { class: "muted" }, "No consumers."),
    ];
  }

  async function connections() {
    const cs = await api("GET", "/api/connections");
    const rows = cs.map((c) => el("tr", { class: c.blocked ? "warn" : "", "data-connection": c.id },
      el("td", { class: "name" }, c.id), el("td", {}, c.peer), el("td", {}, c.user),
      el("td", {}, c.vhost || "-"), el("td", { class: "num" }, c.channels),
      el("td", { class: "num" }, c.heartbeat), el("td", {}, c.blocked ? "blocked" : "running"),
      el("td", { class: "actions" }, may.close(c)
        ? actButton("Close", { "data-action": "close", "data-connection": c.id, class: "act danger" },
            async () => { await api("POST", `/api/connections/${enc(c.id)}/close`); return `Closed connection ${c.id}`; })
        : [])));
    return [
      el("h1", {}, "Connections"),
      cs.length ? table(["id", "peer", "user", "vhost", "channels", "heartbeat", "state", ""], rows, "connections")
        : el("p", { class: "muted" }, "No client connections."),
    ];
  }

  function headers(m) {
    return m.properties.application_headers || m.properties.headers || {};
  }

  function deathReason(m) {
    const h = headers(m);
    const deaths = h["x-death"];
    return Array.isArray(deaths) && deaths.length ? deaths[0].reason || "?" : "-";
  }

  async function deadLetters() {
    const dls = await api("GET", "/api/dead-letters");
    const out = el("div", { id: "dl-result", class: "result" });
    const browse = el("div", { id: "dl-browse" });
    const rows = dls.map((d) => {
      const reasons = Object.keys(d.by_reason);
      const pick = el("select", { "data-queue": d.queue, "aria-label": "reason" },
        el("option", { value: "" }, "every reason"),
        reasons.map((r) => el("option", { value: r }, `${r} (${d.by_reason[r]})`)));
      const q = { vhost: d.vhost, name: d.queue };
      const params = (dry) => {
        const p = new URLSearchParams();
        if (pick.value) p.append("reason", pick.value);
        if (dry) p.append("dry_run", "true");
        return "?" + p.toString();
      };
      const show = (label, r) => {
        out.textContent = "";
        out.append(el("strong", {}, label), " ",
          r.dry_run ? `would move ${kv(r.planned)}` : `moved ${kv(r.moved)}`,
          `, ${r.dry_run ? "would keep" : "kept"} ${r.kept}`);
      };
      const acts = may.act(d.vhost) ? [
        button("Browse", { "data-action": "browse", "data-queue": d.queue }, async () => {
          try { showMessages(browse, q, await api("GET", qpath(q) + "/messages?limit=200"), pick.value); }
          catch (e) { status(e.message, true); }
        }),
        button("Dry run", { "data-action": "dry-run", "data-queue": d.queue }, async () => {
          try { show(`Dry run of ${d.queue}:`, await api("POST", qpath(q) + "/redrive" + params(true))); }
          catch (e) { status(e.message, true); }
        }),
        actButton("Redrive", { "data-action": "redrive", "data-queue": d.queue }, async () => {
          const r = await api("POST", qpath(q) + "/redrive" + params(false));
          show(`Redrive of ${d.queue}:`, r);
          return `Redrove ${d.queue}: moved ${kv(r.moved)}, kept ${r.kept}`;
        }),
      ] : [];
      return el("tr", { "data-queue": d.queue },
        el("td", {}, d.vhost), el("td", { class: "name" }, d.queue),
        el("td", { class: "num", "data-field": "messages" }, d.messages),
        el("td", {}, kv(d.by_reason)), el("td", {}, kv(d.sources)),
        el("td", {}, kv(d.received_by_reason)), el("td", {}, pick), el("td", { class: "actions" }, acts));
    });
    return [
      el("h1", {}, "Dead letters"),
      dls.length ? table(["vhost", "queue", "messages", "by reason", "from", "arrived since start", "reason", ""], rows, "dead-letters")
        : el("p", { class: "muted" }, "No dead-letter queues."),
      out, browse,
    ];
  }

  function showMessages(into, q, msgs, reason) {
    const shown = msgs.filter((m) => !reason || deathReason(m) === reason);
    into.textContent = "";
    into.append(el("h2", {}, `${q.name}: ${shown.length} message${shown.length === 1 ? "" : "s"}` + (reason ? ` dead for ${reason}` : "")),
      table(["id", "reason", "died in", "deaths", "goes back to", "size", "headers"],
        shown.map((m) => {
          const h = headers(m);
          const death = (Array.isArray(h["x-death"]) && h["x-death"][0]) || {};
          return el("tr", { title: JSON.stringify(h, null, 1) },
            el("td", {}, m.id), el("td", {}, deathReason(m)), el("td", {}, death.queue || "-"),
            el("td", { class: "num" }, death.count === undefined ? "-" : death.count),
            el("td", {}, h.REAL_TOPIC || death.queue || "(unknown: stays)"),
            el("td", { class: "num" }, m.size),
            el("td", { class: "headers" }, Object.keys(h).length + " (hover the row)"));
        }), "messages"));
  }

  async function timeline() {
    const rows = await api("GET", "/api/policy-actions");
    return [
      el("h1", {}, "Policy actions"),
      el("p", { class: "muted" }, "What the policies did, newest first (the last 500 since the admin interface started)."),
      rows.length ? el("ol", { class: "timeline" }, rows.map((a) => el("li", { class: "outcome-" + a.outcome },
        el("time", {}, new Date(a.time * 1000).toLocaleString()),
        el("span", { class: "tag" }, a.policy), " ",
        el("strong", {}, a.action), ` on ${a.queue}` + (a.consumer ? ` (consumer ${a.consumer})` : "") + ` in ${a.vhost}: `,
        el("span", { class: "outcome" }, a.outcome),
        el("div", { class: "muted" }, a.reason + (a.threshold ? ` · ${a.threshold}: configured ${fmt(a.configured)}, measured ${fmt(a.measured)}` : "")))))
        : el("p", { class: "muted" }, "No policy action yet."),
    ];
  }

  async function config() {
    if (!me.administrator) return [el("h1", {}, "Configuration"), el("p", { class: "muted" }, "Only an administrator may read the configuration.")];
    const c = await api("GET", "/api/config");
    return [
      el("h1", {}, "Running configuration"),
      el("p", { class: "muted" }, `From ${c.source || "built-in defaults"} (passwords hidden).`),
      el("pre", { class: "summary" }, c.summary),
      c.xml ? el("pre", { class: "xml" }, c.xml) : null,
    ];
  }

  const PAGES = {
    overview, queues, consumers, connections, "dead-letters": deadLetters, timeline, config,
  };

  // ------------------------------------------------------------------ routing, login

  function page() {
    const name = location.hash.slice(1);
    return PAGES[name] ? name : "overview";
  }

  let rendering = false;
  async function render() {
    if (!me || rendering) return;
    rendering = true;
    const name = page();
    for (const a of document.querySelectorAll("#nav a"))
      a.classList.toggle("current", a.id === "nav-" + name);
    try {
      const content = await PAGES[name]();
      if (name === page()) {
        const p = $("page");
        p.textContent = "";
        p.dataset.page = name;
        p.append(...content.flat().filter(Boolean));
      }
    } catch (e) {
      if (e.status === 401) return logout("Logged out: " + e.message);
      status(e.message, true);
    } finally {
      rendering = false;
    }
  }

  // The periodic refresh leaves a page alone while the user is in the middle of something: a
  // button waiting for its confirming click, a reason chosen, results of a browse or dry run.
  function busy() {
    if (armed || document.hidden) return true;
    if ([...document.querySelectorAll("#page select")].some((s) => s.value)) return true;
    return !!document.querySelector("#dl-result:not(:empty), #dl-browse:not(:empty)");
  }

  function tick() {
    if (!busy()) render();
  }

  async function login(user, password) {
    auth = basic(user, password);
    try {
      me = await api("GET", "/api/whoami");
    } catch (e) {
      auth = null;
      $("login-error").textContent = e.status === 401 ? "Login refused: " + e.message.replace(/^401 /, "") : e.message;
      return false;
    }
    sessionStorage.setItem(KEY, auth);
    enter();
    return true;
  }

  function enter() {
    $("login").hidden = true;
    $("nav").hidden = false;
    $("logout").hidden = false;
    $("who").textContent = `${me.name} [${me.tags.join(" ")}]`;
    render();
    clearInterval(timer);
    timer = setInterval(tick, REFRESH_MS);
  }

  function logout(message) {
    sessionStorage.removeItem(KEY);
    auth = null;
    me = null;
    clearInterval(timer);
    $("page").textContent = "";
    $("nav").hidden = true;
    $("logout").hidden = true;
    $("who").textContent = "";
    $("login").hidden = false;
    $("login-error").textContent = message || "";
  }

  document.addEventListener("DOMContentLoaded", async () => {
    $("login").addEventListener("submit", (ev) => {
      ev.preventDefault();
      login($("login-user").value, $("login-password").value);
    });
    $("logout").addEventListener("click", () => logout(""));
    window.addEventListener("hashchange", () => { $("status").textContent = ""; render(); });
    if (auth) {
      try {
        me = await api("GET", "/api/whoami");
        enter();
        return;
      } catch (e) {
        /* stale login: ask again */
      }
    }
    logout("");
  });
})();
