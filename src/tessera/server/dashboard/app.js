// Tessera's dashboard: a small single-page app over the public /v1 API, no framework and no build step.
//
// - Signs in with a bearer token the user pastes, kept in sessionStorage (this tab only); "Sign out" forgets it.
//   Every request sends it in the Authorization header, so a tenant sees only what the API shows it.
// - Views (the URL's hash): #/cluster, #/workloads?state=..&queue=.., #/workloads/ID, #/queues, #/models.
// - Live updates: GET /v1/events/stream read with fetch (which, unlike EventSource, can send the token header).
//   Each "changed" event re-fetches the current view; the page is never reloaded. A slow timer re-fetches too,
//   since a tenant's stream does not tell it about other tenants' work that changes the GPUs' allocation.
// - Queue usage over time: the server's samples of the last hour (GET /v1/queues/usage), fetched when the queue
//   view opens, then the usage each refresh of the view reads appended (on the server's clock).
// - Models: GET /v1/models, then each model's GET /v1/models/NAME/stats (its requests over the last few minutes
//   against its SLO class's targets, its replicas over the last hour, its setup), read again at each refresh.
// - Live logs: /v1/workloads/ID/logs polled with the byte offset the previous answer returned.
// - Everything shown is built with textContent (never innerHTML), so names and logs cannot inject markup.
"use strict";

(() => {
  const TOKEN_KEY = "tessera.token";
  const STATES = ["pending", "running", "succeeded", "failed", "cancelled", "preempted"];
  const REFRESH_FALLBACK_MS = 15000;
  const LOG_POLL_MS = 1000;
  const USAGE_WINDOW_S = 3600; // the queue view's usage over time: the last hour
  const USAGE_MAX_POINTS = 2000; // per queue, in the page

  const state = {
    token: sessionStorage.getItem(TOKEN_KEY),
    lastEventId: null,
    streamAbort: null,
    refreshing: false,
    refreshAgain: false,
    fallbackTimer: null,
    log: null, // {id, offset, timer, finished}
    usage: new Map(), // queue -> {points: [{at, gpu, nominal}], fromServer}: the queue view's usage over time
    usageLoaded: false, // the server's history is fetched each time the queue view opens
    clockSkew: 0, // the server's clock minus the browser's, in seconds
    usagePeriod: null, // how often the server samples a queue's usage at the least, in seconds
    refreshes: 0,
  };
  window.tessera = state; // for the browser tests: what the page knows (no secrets beyond the tab's own token)

  const $ = (selector) => document.querySelector(selector);

  // h("tag.class#id", {attr: value}, ...children): an element; strings become text nodes (never markup).
  function h(spec, attrs, ...children) {
    const [tag, ...rest] = spec.split(/(?=[.#])/);
    const el = document.createElement(tag);
    const classes = rest.filter((p) => p[0] === ".").map((p) => p.slice(1));
    const id = rest.find((p) => p[0] === "#");
    if (classes.length) el.className = classes.join(" ");
    if (id) el.id = id.slice(1);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
      else if (key === "style") el.style.cssText = value;
      else el.setAttribute(key, value === true ? "" : String(value));
    }
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined || child === false) continue;
      el.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return el;
  }

  class Unauthorized extends Error {}

  async function api(path) {
    const response = await fetch(path, { headers: { Authorization: `Bearer ${state.token}` }, cache: "no-store" });
    if (response.status === 401) throw new Unauthorized("the server refused this token");
    if (!response.ok) {
      const body = await response.json().catch(() => ({}));
      throw new Error(`${path}: ${body.detail || response.statusText}`);
    }
    return response.json();
  }

  // ------------------------------------------------------------------------------------------- formatting

  const gpusOf = (milli) => String(Number((milli / 1000).toFixed(3)));
  const mib = (m) => (m >= 1024 ? `${(m / 1024).toFixed(m % 1024 === 0 ? 0 : 1)} GiB` : `${m} MiB`);
  const cores = (m) => `${(m / 1000).toFixed(m % 1000 === 0 ? 0 : 1)}`;
  const when = (t) => (t ? new Date(t * 1000).toLocaleString() : "–");
  const badge = (text, cls) => h(`span.badge.${cls || text}`, {}, text);
  const wlLink = (id, label) => h("a.chip", { href: `#/workloads/${id}`, "data-workload": id }, label || `#${id}`);

  function colorOf(id) {
    const hue = (Number(id) * 137.508) % 360;
    return `hsl(${hue.toFixed(0)} 55% 45%)`;
  }

  function share(w) {
    if (!w.gpus) return "CPU only";
    if (w.gpu_milli < 1000) return `${w.gpus} × ${gpusOf(w.gpu_milli)} GPU`;
    return `${w.gpus} GPU${w.gpus > 1 ? "s" : ""}`;
  }

  const priority = (w) => (w.priority_class ? `${w.priority} (${w.priority_class})` : String(w.priority));

  function quota(entries) {
    if (!entries || !Object.keys(entries).length) return "–";
    return Object.entries(entries)
      .map(([flavor, v]) => {
        const parts = [];
        if (v.gpu_milli !== undefined) parts.push(`${gpusOf(v.gpu_milli)} GPU`);
        if (v.cpu_milli !== undefined) parts.push(`${cores(v.cpu_milli)} CPU`);
        if (v.mem_mib !== undefined) parts.push(mib(v.mem_mib));
        return `${flavor}: ${parts.join(", ") || "no limit"}`;
      })
      .join("; ");
  }

  // ------------------------------------------------------------------------------------------------ views

  async function clusterView() {
    const [nodes, running] = await Promise.all([api("/v1/nodes"), api("/v1/workloads?state=running")]);
    const byId = new Map(running.map((w) => [w.id, w]));
    const shares = new Map(); // "node/gpu" -> [{id, milli}]
    for (const w of running) {
      for (const p of w.placement || []) {
        for (const g of p.gpus) {
          const key = `${p.node}/${g}`;
          if (!shares.has(key)) shares.set(key, []);
          shares.get(key).push({ id: w.id, milli: p.gpu_milli });
        }
      }
    }
    const totalGpus = nodes.reduce((n, node) => n + node.gpus.length, 0);
    const simulated = nodes.some((node) => node.gpus.some((g) => g.simulated));
    const cards = nodes.map((node) =>
      h(
        "div.card.node",
        { "data-node": node.name },
        h(
          "div.node-head",
          {},
          h("h3", {}, node.name),
          h("span.muted", {}, node.gpu_model || "no GPU"),
          h("span", {}, `CPU ${cores(node.cpu_milli - node.cpu_free_milli)}/${cores(node.cpu_milli)} cores used`),
          h("span", {}, `memory ${mib(node.mem_mib - node.mem_free_mib)}/${mib(node.mem_mib)} used`),
        ),
        node.gpus.map((g) => gpuRow(node, g, shares.get(`${node.name}/${g.index}`) || [], byId)),
      ),
    );
    return [
      h(
        "h2",
        {},
        `Cluster: ${nodes.length} node${nodes.length === 1 ? "" : "s"}, ${totalGpus} GPU${totalGpus === 1 ? "" : "s"} `,
        simulated ? badge("simulated GPUs", "simulated") : null,
      ),
      simulated
        ? h("p.muted", {}, "Simulated GPUs: the scheduler places work on them, but the processes see no real GPU.")
        : null,
      cards,
    ];
  }

  function gpuRow(node, g, parts, byId) {
    const mine = new Set(g.workloads);
    const shown = parts.filter((p) => mine.has(p.id));
    const accounted = shown.reduce((n, p) => n + p.milli, 0);
    const others = Math.max(0, g.allocated_milli - accounted);
    const segments = shown.map((p) => {
      const w = byId.get(p.id);
      const label = `#${p.id}${w && w.name ? ` ${w.name}` : ""} · ${gpusOf(p.milli)}`;
      return h(
        "a.seg",
        { href: `#/workloads/${p.id}`, title: label, "data-workload": p.id, style: `width:${p.milli / 10}%;background:${colorOf(p.id)}` },
        label,
      );
    });
    if (others > 0) {
      const title = `${gpusOf(others)} GPU used by workloads not shown to you`;
      segments.push(h("span.seg.others", { title, style: `width:${others / 10}%` }, "others"));
    }
    return h(
      "div.gpu",
      { "data-gpu": `${node.name}/${g.index}`, "data-allocated": g.allocated_milli },
      h(
        "div",
        {},
        h("strong", {}, `GPU ${g.index}`),
        ` ${g.model} · ${mib(g.mem_mib)} `,
        g.simulated ? badge("simulated", "simulated") : null,
      ),
      h("div.bar", { role: "img", "aria-label": `GPU ${g.index}: ${g.allocated_milli}/1000 allocated` }, segments),
      h("div", {}, `${gpusOf(g.allocated_milli)} / 1 allocated`),
      h(
        "div.chips",
        {},
        g.workloads.length ? g.workloads.map((id) => wlLink(id, `#${id}${byId.get(id) ? ` ${byId.get(id).name}` : ""}`)) : h("span.muted", {}, "idle"),
      ),
    );
  }

  async function workloadsView(params) {
    const chosenState = params.get("state") || "";
    const chosenQueue = params.get("queue") || "";
    const query = new URLSearchParams();
    if (chosenState) query.set("state", chosenState);
    if (chosenQueue) query.set("queue", chosenQueue);
    const [workloads, queues] = await Promise.all([api(`/v1/workloads?${query}`), api("/v1/queues")]);
    const select = (name, values, chosen) =>
      h(
        `select`,
        { id: `filter-${name}`, "aria-label": name, onchange: () => applyFilters() },
        h("option", { value: "" }, `any ${name}`),
        values.map((v) => h("option", { value: v, selected: v === chosen }, v)),
      );
    const rows = workloads
      .slice()
      .reverse()
      .map((w) =>
        h(
          "tr.link",
          { "data-workload": w.id, "data-state": w.state, onclick: () => (location.hash = `#/workloads/${w.id}`) },
          h("td", {}, h("a", { href: `#/workloads/${w.id}` }, `#${w.id}`)),
          h("td", {}, w.name || h("span.muted", {}, w.command.join(" ").slice(0, 60))),
          h("td", {}, badge(w.state)),
          h("td", {}, w.tenant),
          h("td", {}, w.queue),
          h("td", {}, share(w), w.simulated_gpus ? [" ", badge("simulated", "simulated")] : null),
          h("td", {}, priority(w)),
          h("td", {}, when(w.submitted_at)),
          h("td.reason", {}, w.reason),
        ),
      );
    return [
      h("h2", {}, `Workloads (${workloads.length})`),
      h(
        "div.filters",
        {},
        "Filter: ",
        select("state", STATES, chosenState),
        select("queue", queues.map((q) => q.name), chosenQueue),
      ),
      h(
        "table#workloads",
        {},
        h("thead", {}, h("tr", {}, ["id", "name", "state", "tenant", "queue", "GPUs", "priority", "submitted", "why pending / how it ended"].map((t) => h("th", {}, t)))),
        h("tbody", {}, rows.length ? rows : h("tr", {}, h("td", { colspan: 9 }, h("span.muted", {}, "none")))),
      ),
    ];
  }

  function applyFilters() {
    const query = new URLSearchParams();
    for (const name of ["state", "queue"]) {
      const value = $(`#filter-${name}`).value;
      if (value) query.set(name, value);
    }
    location.hash = `#/workloads${query.toString() ? `?${query}` : ""}`;
  }

  async function workloadView(id) {
    const [w, events] = await Promise.all([api(`/v1/workloads/${id}`), api(`/v1/workloads/${id}/events`)]);
    const kv = (pairs) => h("dl.kv", {}, pairs.filter(Boolean).map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
    const request = kv([
      ["command", h("code", {}, w.command.join(" "))],
      ["kind", w.kind],
      ["GPUs", share(w)],
      w.gpu_mem_mib ? ["GPU memory", mib(w.gpu_mem_mib)] : null,
      w.gpu_types.length ? ["GPU types", w.gpu_types.join(", ")] : null,
      ["CPU", `${cores(w.cpu_milli)} cores`],
      ["memory", mib(w.mem_mib)],
      ["priority", priority(w)],
      ["tenant / queue", `${w.tenant} / ${w.queue}`],
      ["submitted", when(w.submitted_at)],
      ["started", when(w.started_at)],
      ["finished", when(w.finished_at)],
      ["exit code", w.exit_code === null ? "–" : w.exit_code],
      ["attempts", w.attempts],
    ]);
    const placement = w.placement
      ? h(
          "table#placement",
          {},
          h("thead", {}, h("tr", {}, ["node", "GPUs", "share of each", "UUIDs"].map((t) => h("th", {}, t)))),
          h(
            "tbody",
            {},
            w.placement.map((p) =>
              h("tr", {}, h("td", {}, p.node), h("td", {}, p.gpus.join(", ")), h("td", {}, gpusOf(p.gpu_milli)), h("td", {}, h("code", {}, p.uuids.join(" ")))),
            ),
          ),
        )
      : h("p.muted", {}, "not placed now");
    const eventRows = events.map((e) => h("tr", {}, h("td", {}, when(e.at)), h("td", {}, e.kind), h("td", {}, e.message)));
    return [
      h("h2", {}, h("a", { href: "#/workloads" }, "Workloads"), ` / #${w.id} ${w.name} `, badge(w.state)),
      w.state === "pending" ? h("div.why#why", {}, h("strong", {}, "Why pending: "), w.reason || "waiting for the next step") : null,
      w.state !== "pending" && w.reason ? h("p#ended", {}, h("strong", {}, "Reason: "), w.reason) : null,
      h("div.card#request", {}, h("h3", {}, "Request"), request),
      h(
        "div.card",
        {},
        h("h3", {}, "Placement ", w.placement && w.simulated_gpus ? badge("simulated GPUs", "simulated") : null),
        placement,
      ),
      h(
        "div.card",
        {},
        h("h3", {}, "Events"),
        h("table#events", {}, h("thead", {}, h("tr", {}, ["at", "kind", "message"].map((t) => h("th", {}, t)))), h("tbody", {}, eventRows)),
      ),
    ];
  }

  async function queuesView() {
    const [queues, history] = await Promise.all([
      api("/v1/queues"),
      state.usageLoaded ? null : api(`/v1/queues/usage?window_s=${USAGE_WINDOW_S}`),
    ]);
    if (history) {
      state.clockSkew = history.now - Date.now() / 1000;
      state.usagePeriod = history.period_s;
      state.usage = new Map(
        history.queues.map((q) => [
          q.queue,
          { points: q.points.map((p) => ({ at: p.at, gpu: p.gpu_milli, nominal: p.nominal_milli })), fromServer: q.points.length },
        ]),
      );
      state.usageLoaded = true;
    }
    const now = Date.now() / 1000 + state.clockSkew;
    const seen = queues.map((q) => {
      const used = Object.values(q.usage).reduce((n, u) => n + (u.gpu_milli || 0), 0);
      // The GPU quota: null when there is none (an empty nominal is the whole pool; an entry may leave GPUs out).
      const entries = Object.values(q.nominal);
      const nominal = entries.length && entries.every((v) => v.gpu_milli !== undefined) ? entries.reduce((n, v) => n + v.gpu_milli, 0) : null;
      return { q, used, nominal, series: appendUsage(q.name, { at: now, gpu: used, nominal }, now) };
    });
    // The time axis, shared by all queues: the last hour, or less while the server has not sampled that long.
    const earliest = Math.min(now, ...seen.map(({ series }) => series.points[0].at));
    const span = Math.min(USAGE_WINDOW_S, Math.max(10, now - earliest));
    const rows = seen.map(({ q, used, nominal, series }) => {
      const borrowing = nominal !== null && used > nominal;
      const ratio = nominal ? Math.min(1, used / nominal) : 1;
      return h(
        "tr",
        { "data-queue": q.name },
        h("td", {}, q.name),
        h("td", {}, q.tenant),
        h("td", {}, q.cohort || "–"),
        h("td", {}, quota(q.nominal) === "–" ? "whole pool" : quota(q.nominal)),
        h("td", {}, q.borrowing_limit === null ? (q.cohort ? "no limit" : "–") : quota(q.borrowing_limit)),
        h("td", {}, q.lending_limit === null ? (q.cohort ? "no limit" : "–") : quota(q.lending_limit)),
        h(
          "td",
          {},
          nominal === null ? null : h(`span.minibar${borrowing ? ".over" : ""}`, { title: `of ${gpusOf(nominal)} GPU nominal` }, h("span", { style: `width:${(ratio * 100).toFixed(0)}%` })),
          ` ${gpusOf(used)} GPU `,
          nominal === null ? h("span.muted", {}, "(no GPU quota) ") : null,
          borrowing ? badge("borrowing", "borrowing") : null,
        ),
        h("td", {}, sparkline(series, now, span)),
        h("td", {}, String(q.running)),
        h("td", {}, String(q.pending)),
        h("td", {}, `${q.strategy}, weight ${q.weight}`),
      );
    });
    return [
      h("h2", {}, `Queues (${queues.length})`),
      h(
        "table#queues",
        {},
        h("thead", {}, h("tr", {}, ["queue", "tenant", "cohort", "nominal quota", "borrowing limit", "lending limit", "GPU in use", `GPU in use, last ${spanText(span)}`, "running", "pending", "order"].map((t) => h("th", {}, t)))),
        h("tbody", {}, rows),
      ),
      h("p.muted", {}, `GPU in use over time: the server's samples (on each change, and every ${state.usagePeriod} s; kept for a day, the last hour shown), then what this page reads; dashed: the nominal quota.`),
    ];
  }

  // The queue's usage with `point` appended; points before the window go, but the last of them is kept (it says
  // what the usage was when the window begins).
  function appendUsage(queue, point, now) {
    const series = state.usage.get(queue) || { points: [], fromServer: 0 };
    series.points.push(point);
    const start = now - USAGE_WINDOW_S;
    while (series.points.length > 1 && (series.points[1].at <= start || series.points.length > USAGE_MAX_POINTS)) series.points.shift();
    state.usage.set(queue, series);
    return series;
  }

  const spanText = (s) => (s >= 3600 ? "hour" : s < 120 ? `${Math.round(s)} s` : `${Math.round(s / 60)} min`);

  // A step line of GPU in use over the last `span` seconds (and the nominal quota, dashed), on a shared time axis.
  function sparkline(series, now, span) {
    const points = series.points;
    const top = Math.max(1000, ...points.map((p) => Math.max(p.gpu, p.nominal || 0)));
    const peak = Math.max(0, ...points.map((p) => p.gpu));
    const title = `GPU in use over the last ${spanText(span)}: peak ${gpusOf(peak)}, now ${gpusOf(points.length ? points[points.length - 1].gpu : 0)} (${series.fromServer} samples from the server)`;
    const svg = stepChart(points, now, span, top, title, [["nominal", (p) => p.nominal], ["used", (p) => p.gpu]]);
    svg.dataset.serverPoints = String(series.fromServer);
    return svg;
  }

  // Step lines over the last `span` seconds: `lines` is [[class, point => value or null]], drawn in that order on a
  // 0..top scale; each point's value holds until the next point (the last one until `now`).
  function stepChart(points, now, span, top, title, lines) {
    const width = 160;
    const height = 24;
    const start = now - span;
    const x = (at) => ((Math.max(0, at - start) / span) * width).toFixed(1);
    const y = (v) => (height - 1 - (v / top) * (height - 2)).toFixed(1);
    const steps = (value) => {
      const out = [];
      points.forEach((p, i) => {
        const v = value(p);
        if (v === null || v === undefined) return;
        const end = i + 1 < points.length ? points[i + 1].at : now;
        out.push(`${x(p.at)},${y(v)}`, `${x(end)},${y(v)}`);
      });
      return out.join(" ");
    };
    const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
    svg.setAttribute("class", "spark");
    svg.setAttribute("width", width);
    svg.setAttribute("height", height);
    svg.dataset.points = String(points.length);
    if (points.length) svg.dataset.firstAt = String(points[0].at);
    const caption = document.createElementNS("http://www.w3.org/2000/svg", "title");
    caption.textContent = title;
    svg.append(caption);
    for (const [cls, value] of lines) {
      const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
      line.setAttribute("class", cls);
      line.setAttribute("points", steps(value));
      svg.append(line);
    }
    return svg;
  }

  async function modelsView() {
    const models = await api("/v1/models");
    // Each model's requests, replicas over time and setup (GET /v1/models/NAME/stats); one that fails (a model
    // deleted meanwhile) leaves its row without figures rather than the view without a table.
    const stats = await Promise.all(models.map((m) => api(`/v1/models/${encodeURIComponent(m.name)}/stats`).catch(() => null)));
    const rows = models.map((m) =>
      h(
        "tr",
        { "data-model": m.name },
        h("td", {}, h("strong", {}, m.name)),
        h("td", {}, [badge(m.state), m.last_error ? h("div.error", {}, m.last_error) : null]),
        h("td", {}, `${m.replicas} ready / ${m.desired_replicas} desired (${m.min_replicas}–${m.max_replicas})`),
        h("td", {}, `${m.engine}: ${m.model}`),
        h("td", {}, m.gpus ? `${m.gpus} × ${gpusOf(m.gpu_milli)} GPU` : "CPU"),
        h("td", {}, m.slo),
        h("td", {}, h("code.url", {}, m.openai_base_url)),
        h("td", {}, m.replica_workloads.map((id) => wlLink(id))),
        h("td", {}, `${m.tenant} / ${m.queue}`),
      ),
    );
    const windows = stats.filter((st) => st && st.window);
    const windowText = windows.length ? spanText(windows[0].window.window_s) : "5 min";
    return [
      h("h2", {}, `Models (${models.length})`),
      h("p.muted", {}, "Point an OpenAI client at the base URL, with a tenant token as the API key."),
      h(
        "table#models",
        {},
        h("thead", {}, h("tr", {}, ["model", "state", "replicas", "engine", "per replica", "SLO", "OpenAI base URL", "replica workloads", "tenant / queue"].map((t) => h("th", {}, t)))),
        h("tbody", {}, rows.length ? rows : h("tr", {}, h("td", { colspan: 9 }, h("span.muted", {}, "no model deployed")))),
      ),
      models.length ? servingTable(models, stats, windowText) : null,
    ];
  }

  const seconds = (v) => (v === null || v === undefined ? "–" : v < 1 ? `${Math.round(v * 1000)} ms` : `${Number(v.toFixed(2))} s`);
  const rateText = (r) => (r >= 10 ? r.toFixed(0) : r >= 1 ? r.toFixed(1) : r.toFixed(2));
  const SLO_GOAL_PCT = 99; // attainment below this is shown as a miss (the serving twin's acceptance level)

  // A latency pair "p50 / p99" against a target: each figure over it is marked (class "over").
  function latency(cls, p50, p99, target) {
    const figure = (v) => h(`span${v !== null && v !== undefined && v > target ? ".over" : ""}`, {}, seconds(v));
    return h(`td.${cls}`, {}, figure(p50), " / ", figure(p99), h("div.muted", {}, `target ${seconds(target)}`));
  }

  // The models' requests over the last few minutes against their SLO, their replicas over the last hour, and the
  // setup they are served with.
  function servingTable(models, stats, windowText) {
    const rows = models.map((m, i) => {
      const st = stats[i];
      if (!st) return h("tr", { "data-model-stats": m.name }, h("td", {}, h("strong", {}, m.name)), h("td", { colspan: 7 }, h("span.muted", {}, "no figures")));
      const w = st.window;
      const last = st.replicas.length ? st.replicas[st.replicas.length - 1] : null;
      const attainment = w && w.slo_attainment_pct !== null ? w.slo_attainment_pct : null;
      const setup = [
        st.setup.serving_setup ? `setup ${st.setup.serving_setup}` : null,
        `router ${st.setup.router}`,
        st.setup.autoscaler ? `autoscaler ${st.setup.autoscaler}` : null,
        `SLO ${st.setup.slo}`,
        st.setup.replica_concurrency ? `${st.setup.replica_concurrency} at once per replica` : null,
      ].filter(Boolean);
      return h(
        "tr",
        { "data-model-stats": m.name, "data-rate": w ? w.rate_per_s : "", "data-requests": w ? w.requests : "", "data-ready": last ? last.ready : "" },
        h("td", {}, h("strong", {}, m.name)),
        h("td.rate", {}, w ? `${rateText(w.rate_per_s)} req/s` : h("span.muted", {}, "no gateway"), w ? h("div.muted", {}, `${w.requests} answered`) : null),
        w ? latency("ttft", w.ttft_p50_s, w.ttft_p99_s, st.targets.ttft_s) : h("td", {}, "–"),
        w ? latency("tpot", w.tpot_p50_s, w.tpot_p99_s, st.targets.tpot_s) : h("td", {}, "–"),
        h("td.slo", {}, attainment === null ? "–" : h(`span${attainment < SLO_GOAL_PCT ? ".over" : ""}`, {}, `${attainment.toFixed(1)}%`)),
        h("td.errors", {}, w ? h(`span${w.errors ? ".over" : ""}`, {}, String(w.errors)) : "–"),
        h("td.replicas", {}, replicaChart(st, m), " ", last ? `${last.ready} ready / ${last.desired} desired` : h("span.muted", {}, "none yet")),
        h("td.setup", {}, setup.join(", ")),
      );
    });
    return [
      h("h3", {}, `Requests (last ${windowText}) and replicas (last hour)`),
      h(
        "table#model-stats",
        {},
        h("thead", {}, h("tr", {}, ["model", "rate", "TTFT p50 / p99", "TPOT p50 / p99", "SLO met", "errors", "replicas over time", "setup"].map((t) => h("th", {}, t)))),
        h("tbody", {}, rows),
      ),
      h(
        "p.muted",
        {},
        "As the gateway answered them: TTFT from arrival to the first bytes (a plain answer's is the whole answer), TPOT between a stream's tokens. ",
        "Red: over the model's SLO class's target, or under ",
        `${SLO_GOAL_PCT}% of the requests within it. Replicas: ready, solid; desired, dashed.`,
      ),
    ];
  }

  // The model's replicas over the last hour (from its first point when that is later): ready and desired.
  function replicaChart(st, m) {
    const points = st.replicas;
    const earliest = points.length ? points[0].at : st.now;
    const span = Math.min(st.replicas_window_s, Math.max(10, st.now - earliest));
    const top = Math.max(1, m.max_replicas, ...points.map((p) => Math.max(p.ready, p.running, p.desired)));
    const peak = Math.max(0, ...points.map((p) => p.ready));
    const title = `replicas over the last ${spanText(span)}: ready now ${points.length ? points[points.length - 1].ready : 0}, peak ${peak}`;
    return stepChart(points, st.now, span, top, title, [["nominal", (p) => p.desired], ["used", (p) => p.ready]]);
  }

  // ---------------------------------------------------------------------------------------------- logs

  function startLog(id) {
    if (state.log && state.log.id === id) return;
    stopLog();
    const pre = h("pre.log#log", { "aria-label": "log" });
    const box = h("div.card#logbox", {}, h("h3", {}, "Log ", h("span.muted#log-state", {}, "(live)")), pre);
    state.log = { id, offset: 0, timer: null, finished: false, box, pre };
    const poll = async () => {
      const log = state.log;
      if (!log || log.id !== id) return;
      try {
        const chunk = await api(`/v1/workloads/${id}/logs?offset=${log.offset}`);
        if (chunk.data) {
          const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
          pre.append(document.createTextNode(chunk.data));
          if (atBottom) pre.scrollTop = pre.scrollHeight;
        }
        log.offset = chunk.next_offset;
        if (chunk.finished && !chunk.data) {
          log.finished = true;
          box.querySelector("#log-state").textContent = "(ended)";
          return;
        }
      } catch (error) {
        if (error instanceof Unauthorized) return signOut(error.message);
      }
      if (state.log === log) log.timer = setTimeout(poll, LOG_POLL_MS);
    };
    poll();
  }

  function stopLog() {
    if (state.log && state.log.timer) clearTimeout(state.log.timer);
    state.log = null;
  }

  // ------------------------------------------------------------------------------------- routing, refresh

  function route() {
    const [path, query] = (location.hash.slice(1) || "/cluster").split("?");
    const parts = path.split("/").filter(Boolean);
    return { view: parts[0] || "cluster", id: parts[1] ? Number(parts[1]) : null, params: new URLSearchParams(query || "") };
  }

  async function render() {
    if (!state.token) return;
    if (state.refreshing) {
      state.refreshAgain = true;
      return;
    }
    state.refreshing = true;
    try {
      do {
        state.refreshAgain = false;
        await renderOnce();
      } while (state.refreshAgain && state.token);
    } finally {
      state.refreshing = false;
    }
  }

  async function renderOnce() {
    const r = route();
    if (r.view !== "queues") state.usageLoaded = false; // opening the queue view again fetches the history again
    for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.view === r.view);
    let content;
    try {
      if (r.view === "workloads" && r.id) content = await workloadView(r.id);
      else if (r.view === "workloads") content = await workloadsView(r.params);
      else if (r.view === "queues") content = await queuesView();
      else if (r.view === "models") content = await modelsView();
      else content = await clusterView();
      $("#error").hidden = true;
    } catch (error) {
      if (error instanceof Unauthorized) return signOut(error.message);
      $("#error").textContent = String(error.message || error);
      $("#error").hidden = false;
      return;
    }
    if (route().view !== r.view || route().id !== r.id) return; // the user moved on while this loaded
    const view = $("#view");
    const keepLog = r.view === "workloads" && r.id && state.log && state.log.id === r.id;
    if (keepLog) {
      // The log box stays where it is (moving it would lose its scroll position); the rest is replaced.
      for (const child of [...view.children]) if (child !== state.log.box) child.remove();
      state.log.box.before(...[content].flat(Infinity).filter(Boolean));
    } else if (r.view === "workloads" && r.id) {
      startLog(r.id);
      view.replaceChildren(...[content].flat(Infinity).filter(Boolean), state.log.box);
    } else {
      stopLog();
      view.replaceChildren(...[content].flat(Infinity).filter(Boolean));
    }
    view.dataset.view = r.view;
    state.refreshes += 1;
    view.dataset.refreshes = String(state.refreshes);
  }

  // The event stream: fetch with the token header, parsed as Server-Sent Events; reconnects after it ends.
  async function streamLoop() {
    while (state.token) {
      const abort = new AbortController();
      state.streamAbort = abort;
      try {
        const response = await fetch("/v1/events/stream", {
          headers: { Authorization: `Bearer ${state.token}`, Accept: "text/event-stream" },
          signal: abort.signal,
          cache: "no-store",
        });
        if (response.status === 401) return signOut("the server refused this token");
        if (!response.ok) throw new Error(`event stream: ${response.status}`);
        setLive(true);
        const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
        let buffer = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buffer += value.replace(/\r\n?/g, "\n");
          let end;
          while ((end = buffer.indexOf("\n\n")) >= 0) {
            onEvent(buffer.slice(0, end));
            buffer = buffer.slice(end + 2);
          }
        }
      } catch (error) {
        if (abort.signal.aborted) return;
      }
      setLive(false);
      await new Promise((resolve) => setTimeout(resolve, 2000));
    }
  }

  function onEvent(block) {
    let kind = "message";
    let data = "";
    for (const line of block.split("\n")) {
      if (line.startsWith(":")) continue;
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
      if (field === "event") kind = value;
      else if (field === "data") data += value;
    }
    if (kind !== "changed") return;
    const latest = JSON.parse(data).last_event_id;
    if (latest === state.lastEventId) return;
    state.lastEventId = latest;
    $("#live").dataset.lastEventId = String(latest);
    render(); // also on the first event: a change between the first render and the stream's start is not lost
  }

  function setLive(on) {
    const live = $("#live");
    live.classList.toggle("on", on);
    live.textContent = on ? "live" : "offline";
  }

  // -------------------------------------------------------------------------------------- sign in and out

  async function whoAmI() {
    const admin = await fetch("/v1/tokens", { headers: { Authorization: `Bearer ${state.token}` } });
    if (admin.status === 401) throw new Unauthorized("the server refused this token");
    if (admin.ok) return "admin";
    const queues = await api("/v1/queues");
    return queues.length ? `tenant ${queues[0].tenant}` : "tenant";
  }

  async function signIn(token) {
    state.token = token;
    let who;
    try {
      who = await whoAmI();
    } catch (error) {
      state.token = null;
      $("#signin-error").textContent = error instanceof Unauthorized ? "That token was refused." : String(error.message || error);
      return showSignIn();
    }
    sessionStorage.setItem(TOKEN_KEY, token);
    $("#signin").hidden = true;
    $("#signin-error").textContent = "";
    $("#nav").hidden = false;
    $("#signout").hidden = false;
    $("#who").textContent = who;
    streamLoop();
    state.fallbackTimer = setInterval(render, REFRESH_FALLBACK_MS);
    render();
  }

  function signOut(message) {
    state.token = null;
    state.lastEventId = null;
    sessionStorage.removeItem(TOKEN_KEY);
    if (state.streamAbort) state.streamAbort.abort();
    if (state.fallbackTimer) clearInterval(state.fallbackTimer);
    stopLog();
    setLive(false);
    $("#view").replaceChildren();
    $("#who").textContent = "";
    $("#signin-error").textContent = message || "";
    showSignIn();
  }

  function showSignIn() {
    $("#nav").hidden = true;
    $("#signout").hidden = true;
    $("#signin").hidden = false;
    $("#token").value = "";
    $("#token").focus();
  }

  $("#signin-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const token = $("#token").value.trim();
    if (token) signIn(token);
  });
  $("#signout").addEventListener("click", () => signOut(""));
  window.addEventListener("hashchange", render);

  if (state.token) signIn(state.token);
  else showSignIn();
})();
