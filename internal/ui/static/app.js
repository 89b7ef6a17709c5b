// shaper status page. A client of the JSON API like any other: it polls
// GET /v1/upstreams every two seconds with the key it was given, opens each
// upstream's chart with the last 15 minutes of drain rate (GET
// /v1/upstreams/{name}/history), adds the rates it reads to it, and acts
// through the same endpoints as
// the CLI (pause, resume, the job listing and retry). No framework and no
// build step: this file is served as written, under a CSP that allows only
// scripts from this origin, so it never builds HTML from strings.
"use strict";

(() => {
  const KEY_STORE = "shaper.apiKey";
  const POLL_MS = 2000;
  const WINDOW_MS = 15 * 60 * 1000; // what the chart shows: the history the API keeps (jobstore.History)
  const DEAD_LIMIT = 20;
  const DEAD_REFRESH_MS = 10000; // the dead list is re-read at least this often
  const UNTIL_RESUMED_MS = 300 * 24 * 3600 * 1000; // as status.UntilResumed
  const SVG_NS = "http://www.w3.org/2000/svg";

  const $ = (id) => document.getElementById(id);

  const page = {
    key: "",
    timer: 0,
    // generation changes with the key, so an answer to a request made
    // with the previous key is dropped rather than shown.
    generation: 0,
    cards: new Map(), // upstream name -> Card
    // Why pause and resume are unavailable, once the API has refused them
    // (403: not an admin key); "" until then.
    adminRefusal: "",
    // Set when the server has no job listing (an older server, or one
    // without that endpoint yet): 404 or 405 for GET /v1/jobs.
    jobsMissing: false,
    memoryKey: "", // where the key lives when sessionStorage is unavailable
  };

  // ---- the API -------------------------------------------------------------

  class APIError extends Error {
    constructor(status, title, detail) {
      super(detail || title || "HTTP " + status);
      this.status = status;
      this.title = title || "";
    }
  }

  // apiURL resolves an API path against the page's own address, so the
  // page also works behind a proxy that serves shaper under a sub-path.
  function apiURL(path) {
    return new URL("../" + path, document.baseURI).toString();
  }

  async function api(method, path, body) {
    const headers = { Authorization: "Bearer " + page.key, Accept: "application/json" };
    const init = { method, headers, cache: "no-store", credentials: "omit" };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const res = await fetch(apiURL(path), init);
    const text = await res.text();
    let data = null;
    if (text) {
      try {
        data = JSON.parse(text);
      } catch (e) {
        data = null;
      }
    }
    if (!res.ok) {
      throw new APIError(res.status, data && data.title, data && data.detail);
    }
    return data;
  }

  // ---- the key -------------------------------------------------------------

  // keyFromFragment moves a key given as /ui/#key=KEY into sessionStorage
  // and out of the address bar, so it is neither in the history nor in a
  // bookmark or a screenshot. Fragments never reach the server.
  function keyFromFragment() {
    const parts = location.hash.replace(/^#/, "").split("&").filter((p) => p !== "");
    const rest = [];
    let key = null;
    for (const p of parts) {
      if (p.startsWith("key=")) {
        try {
          key = decodeURIComponent(p.slice(4)).trim();
        } catch (e) {
          key = p.slice(4).trim();
        }
      } else {
        rest.push(p);
      }
    }
    if (key === null) {
      return;
    }
    history.replaceState(history.state, "", location.pathname + location.search + (rest.length ? "#" + rest.join("&") : ""));
    if (key) {
      saveKey(key);
    }
  }

  function saveKey(key) {
    page.memoryKey = key;
    try {
      sessionStorage.setItem(KEY_STORE, key);
    } catch (e) {
      // Storage disabled: the key lasts as long as the page.
    }
  }

  function loadKey() {
    try {
      return sessionStorage.getItem(KEY_STORE) || page.memoryKey;
    } catch (e) {
      return page.memoryKey;
    }
  }

  function dropKey() {
    page.memoryKey = "";
    try {
      sessionStorage.removeItem(KEY_STORE);
    } catch (e) {
      // nothing stored
    }
  }

  // ---- page states ---------------------------------------------------------

  function start() {
    keyFromFragment();
    $("key-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const key = $("key-input").value.trim();
      if (!key) {
        return;
      }
      $("key-input").value = "";
      saveKey(key);
      begin();
    });
    $("forget").addEventListener("click", () => showLogin(""));
    // A link with another key, opened in this tab, only changes the
    // fragment: the page is not loaded again, so it switches keys here.
    window.addEventListener("hashchange", () => {
      const before = loadKey();
      keyFromFragment();
      if (loadKey() !== before) {
        begin();
      }
    });
    if (loadKey()) {
      begin();
    } else {
      showLogin("");
    }
  }

  function begin() {
    clearTimeout(page.timer);
    for (const card of page.cards.values()) {
      card.root.remove();
    }
    page.cards.clear();
    page.key = loadKey();
    page.generation++;
    page.adminRefusal = "";
    page.jobsMissing = false;
    $("login").hidden = true;
    $("forget").hidden = false;
    setConnection("Connecting…");
    poll();
  }

  // showLogin forgets the key and asks for one, saying why when a key was
  // refused.
  function showLogin(message) {
    clearTimeout(page.timer);
    page.generation++;
    page.key = "";
    dropKey();
    for (const card of page.cards.values()) {
      card.root.remove();
    }
    page.cards.clear();
    $("login").hidden = false;
    $("forget").hidden = true;
    $("login-error").textContent = message;
    $("updated").textContent = "";
    setConnection("Not connected: the page needs an API key.");
    $("key-input").focus();
  }

  function setConnection(text) {
    const el = $("connection");
    // Only a change is written, so a screen reader hears changes of
    // state, not a clock ticking every two seconds.
    if (el.textContent !== text) {
      el.textContent = text;
    }
  }

  async function poll() {
    clearTimeout(page.timer);
    const gen = page.generation;
    try {
      const data = await api("GET", "v1/upstreams");
      if (gen !== page.generation) {
        return;
      }
      const upstreams = (data && data.upstreams) || [];
      // A new card opens with its history, so its first paint has it.
      const histories = await readHistories(upstreams.filter((u) => !page.cards.has(u.name)).map((u) => u.name));
      if (gen !== page.generation) {
        return;
      }
      const now = Date.now();
      render(upstreams, now, histories);
      await readSchedules(gen);
      setConnection(upstreams.length ? "Live: read every " + POLL_MS / 1000 + " s." : "Live: no upstreams are configured.");
      $("updated").textContent = "Last read " + clock(now) + ".";
    } catch (err) {
      if (gen !== page.generation) {
        return;
      }
      if (err instanceof APIError && err.status === 401) {
        showLogin("The API refused that key: " + err.message);
        return;
      }
      setConnection("Cannot read the API (" + err.message + "); showing the last answer and trying again.");
    }
    page.timer = setTimeout(poll, POLL_MS);
  }

  // readHistories reads each named upstream's drain history: name ->
  // points, oldest first. One the API does not give (an older server
  // answers 404, or the read fails) is left out: that chart starts with
  // this page's own readings, as it always did.
  async function readHistories(names) {
    const out = new Map();
    await Promise.all(names.map(async (name) => {
      try {
        const h = await api("GET", "v1/upstreams/" + encodeURIComponent(name) + "/history");
        if (h && Array.isArray(h.points)) {
          out.set(name, h.points);
        }
      } catch (err) {
        // Not shown: the status itself is what the page is for.
      }
    }));
    return out;
  }

  // readSchedules shows the key's tenant's schedules: next and last run,
  // the last job, and why the last run was refused. A server without
  // schedules (404) or a failed read leaves the section as it was.
  async function readSchedules(gen) {
    let data;
    try {
      data = await api("GET", "v1/schedules");
    } catch (err) {
      return;
    }
    if (gen !== page.generation) {
      return;
    }
    const list = (data && data.schedules) || [];
    const rows = list.map((s) => {
      let state = s.paused ? "paused" : "active";
      if (!s.paused && s.last_error) {
        state = "refused: " + s.last_error;
      }
      if (s.source === "config") {
        state += " (config)";
      }
      return el("tr", { "data-schedule": s.name }, [
        el("td", {}, [s.name]),
        el("td", {}, [s.cron + " (" + (s.timezone || "UTC") + ")"]),
        el("td", { class: s.last_error ? "error" : "" }, [state]),
        el("td", {}, [s.next_run_at ? dateTime(s.next_run_at) : "–"]),
        el("td", {}, [s.last_run_at ? dateTime(s.last_run_at) : "–"]),
        el("td", {}, [s.last_job_id || "–"]),
      ]);
    });
    $("schedule-rows").replaceChildren(...rows);
    $("schedules").hidden = list.length === 0;
  }

  function render(upstreams, now, histories) {
    const container = $("upstreams");
    const seen = new Set();
    for (const u of upstreams) {
      seen.add(u.name);
      let card = page.cards.get(u.name);
      if (!card) {
        card = new Card(u.name, histories && histories.get(u.name));
        page.cards.set(u.name, card);
      }
      container.appendChild(card.root); // keeps the API's order (by name)
      card.update(u, now);
    }
    for (const [name, card] of page.cards) {
      if (!seen.has(name)) {
        card.root.remove();
        page.cards.delete(name);
      }
    }
  }

  // ---- one upstream --------------------------------------------------------

  let cardCount = 0;

  class Card {
    constructor(name, points) {
      this.name = name;
      this.id = "u" + ++cardCount;
      this.history = []; // {t, drain, limit}: the API's history, then as polled
      this.seed = points || []; // the API's history, taken in by the first update
      this.seeded = false;
      this.last = null;
      this.dead = { inFlight: false, fetchedAt: 0, count: -1, stale: true, ids: "" };

      const h2 = el("h2", { id: this.id + "-h" }, [el("span", { "data-field": "name" }, [name])]);
      this.badge = el("span", { class: "badge" });
      h2.appendChild(this.badge);
      this.root = el("section", { class: "upstream", "aria-labelledby": this.id + "-h", "data-upstream": name }, [h2]);

      // Headline numbers.
      this.facts = {};
      const dl = el("dl", { class: "facts" });
      const fact = (key, label) => {
        const dd = el("dd", { "data-field": key });
        dl.appendChild(el("div", {}, [el("dt", {}, [label]), dd]));
        this.facts[key] = dd;
      };
      fact("drain_rate", "Drain rate, last 10 s");
      fact("drain_rate_60s", "Drain rate, last 60 s");
      fact("limit", "Limit, as paced now");
      fact("backlog", "Backlog");
      fact("time_to_drain", "Time to drain");
      fact("time_to_drain_at_limit", "Time to drain at the limit");
      fact("in_flight", "In flight");
      fact("retrying", "Retrying");
      fact("proxy_waiting", "Proxied calls waiting");
      fact("dead", "Dead");
      fact("succeeded", "Succeeded");
      fact("callbacks_failed", "Failing callbacks, last 24 h");
      this.root.appendChild(dl);

      // Paused or blocked, with the admin's buttons.
      this.pauseState = el("p", { class: "state", "data-field": "pause_state" });
      this.pauseFor = el("select", { id: this.id + "-for" }, [
        el("option", { value: "30s" }, ["for 30 s"]),
        el("option", { value: "5m" }, ["for 5 min"]),
        el("option", { value: "1h" }, ["for 1 h"]),
        el("option", { value: "" }, ["until resumed"]),
      ]);
      this.pauseButton = el("button", { type: "button" }, ["Pause"]);
      this.resumeButton = el("button", { type: "button" }, ["Resume"]);
      this.pauseNote = el("p", { class: "note" });
      this.pauseMessage = el("p", { class: "message", role: "status" });
      this.pauseButton.addEventListener("click", () => this.pause());
      this.resumeButton.addEventListener("click", () => this.resume());
      this.root.appendChild(el("h3", {}, ["Paused or running"]));
      this.root.appendChild(el("div", { class: "pause" }, [
        this.pauseState,
        el("label", { for: this.id + "-for", class: "visually-hidden" }, ["Pause duration"]),
        this.pauseFor, this.pauseButton, this.resumeButton, this.pauseNote, this.pauseMessage,
      ]));

      // The chart, with its numbers in words.
      this.root.appendChild(el("h3", {}, ["Drain rate against the limit"]));
      this.chart = svg("svg", { class: "chart", viewBox: "0 0 640 200", role: "img", "aria-labelledby": this.id + "-cap" });
      this.caption = el("figcaption", { id: this.id + "-cap", "data-field": "chart_caption" });
      this.root.appendChild(el("figure", {}, [
        el("ul", { class: "legend", "aria-hidden": "true" }, [
          el("li", { class: "key-drain" }, ["drain rate (last 10 s)"]),
          el("li", { class: "key-limit" }, ["limit"]),
        ]),
        this.chart, this.caption,
      ]));

      // Backlog by lane.
      this.root.appendChild(el("h3", {}, ["Backlog by lane"]));
      this.lanes = el("tbody");
      this.root.appendChild(el("table", { "data-field": "lanes" }, [
        el("caption", {}, ["Jobs of every tenant, by lane and state"]),
        el("thead", {}, [el("tr", {}, ["Lane", "Queued", "Scheduled", "Retrying", "Active", "Backlog", "Dead", "Succeeded"]
          .map((t) => el("th", { scope: "col" }, [t])))]),
        this.lanes,
      ]));

      // Dead jobs, with retry.
      this.root.appendChild(el("h3", {}, ["Dead jobs"]));
      this.deadStatus = el("p", { class: "notice", "data-field": "dead_status" });
      this.deadMessage = el("p", { class: "message", role: "status" });
      this.deadTable = el("div");
      this.root.appendChild(this.deadStatus);
      this.root.appendChild(this.deadMessage);
      this.root.appendChild(this.deadTable);
    }

    update(u, now) {
      this.last = u;
      const limit = limitPerSecond(u.limits);
      const drain = (u.drain_rate && u.drain_rate.last_10s) || 0;
      if (this.seed.length) {
        // Each step's rate over its 10 s, as last_10s is; the limit of the
        // past is not kept, so it is drawn at the limit as paced now.
        for (const p of this.seed) {
          const t = Date.parse(p.at);
          if (t < now && (!this.history.length || t > this.history[this.history.length - 1].t)) {
            this.history.push({ t, drain: p.drain_rate || 0, limit });
          }
        }
        this.seed = [];
        this.seeded = true;
      }
      this.history.push({ t: now, drain, limit });
      while (this.history.length && this.history[0].t < now - WINDOW_MS) {
        this.history.shift();
      }

      const f = this.facts;
      f.drain_rate.textContent = rate(drain);
      f.drain_rate_60s.textContent = rate((u.drain_rate && u.drain_rate.last_60s) || 0);
      f.limit.textContent = limit === null ? "none on requests" : rate(limit);
      if (u.override) {
        // An operator's limits replace the configured ones (PUT .../limits).
        f.limit.textContent += " (set by an operator)";
      }
      f.limit.title = (u.limits || []).map((l) => l.description + (l.source && l.source !== "configured" ? " (" + l.source + ")" : "")).join("; ");
      f.backlog.textContent = count((u.backlog && u.backlog.total) || 0);
      f.time_to_drain.textContent = timeToDrain(u);
      f.time_to_drain_at_limit.textContent = duration(u.time_to_drain_at_limit_seconds || 0);
      f.in_flight.textContent = count(u.in_flight || 0);
      f.retrying.textContent = count(u.retrying || 0);
      f.proxy_waiting.textContent = count(u.proxy_waiting || 0);
      f.dead.textContent = count(u.dead || 0);
      f.succeeded.textContent = count(u.succeeded || 0);
      f.callbacks_failed.textContent = count(u.callbacks_failed || 0);

      this.updatePause(u, now);
      this.drawChart(now);
      this.updateLanes(u);
      this.updateDead(u, now);
    }

    updatePause(u, now) {
      const paused = pauseOf(u, now);
      this.badge.textContent = paused.badge;
      this.badge.className = "badge " + paused.kind;
      this.pauseState.textContent = paused.text;
      this.resumeButton.disabled = page.adminRefusal !== "" || paused.kind === "running";
      this.pauseButton.disabled = page.adminRefusal !== "";
      this.pauseFor.disabled = page.adminRefusal !== "";
      this.pauseNote.textContent = page.adminRefusal
        ? page.adminRefusal
        : "Pausing and resuming need an admin key; they act on every worker at once.";
    }

    async pause() {
      const d = this.pauseFor.value;
      await this.act(this.pauseButton, "v1/upstreams/" + encodeURIComponent(this.name) + "/pause", d ? { for: d } : {},
        d ? "Paused for " + d + "." : "Paused until resumed.");
    }

    async resume() {
      await this.act(this.resumeButton, "v1/upstreams/" + encodeURIComponent(this.name) + "/resume", undefined, "Resumed.");
    }

    async act(button, path, body, done) {
      const gen = page.generation;
      button.disabled = true;
      this.pauseMessage.textContent = "";
      try {
        const u = await api("POST", path, body);
        if (gen !== page.generation) {
          return;
        }
        this.pauseMessage.textContent = done;
        if (u && u.name === this.name) {
          this.update(u, Date.now());
        }
      } catch (err) {
        if (gen !== page.generation) {
          return;
        }
        if (err.status === 403) {
          page.adminRefusal = "Pause and resume are off: this key is not an admin key (the API answered 403: " + err.message + ").";
          for (const card of page.cards.values()) {
            if (card.last) {
              card.updatePause(card.last, Date.now());
            }
          }
          return;
        }
        if (err.status === 401) {
          showLogin("The API refused that key: " + err.message);
          return;
        }
        this.pauseMessage.textContent = "Failed: " + err.message;
      } finally {
        if (gen === page.generation && this.last) {
          this.updatePause(this.last, Date.now());
        }
      }
    }

    drawChart(now) {
      const W = 640, H = 200, left = 48, right = 12, top = 12, bottom = 24;
      const pts = this.history;
      let max = 0;
      for (const p of pts) {
        max = Math.max(max, p.drain, p.limit || 0);
      }
      const yMax = niceCeil(max * 1.1);
      const x = (t) => left + ((t - (now - WINDOW_MS)) / WINDOW_MS) * (W - left - right);
      const y = (v) => top + (1 - v / yMax) * (H - top - bottom);
      const g = [];
      for (const v of [0, yMax / 2, yMax]) {
        g.push(svg("line", { class: "grid", x1: left, x2: W - right, y1: y(v), y2: y(v) }));
        g.push(svg("text", { class: "axis", x: left - 6, y: y(v) + 4, "text-anchor": "end" }, [short(v)]));
      }
      const minutes = WINDOW_MS / 60000;
      for (let m = minutes; m >= 0; m -= 5) {
        const t = now - m * 60000;
        g.push(svg("text", { class: "axis", x: x(t), y: H - 6, "text-anchor": m === minutes ? "start" : m === 0 ? "end" : "middle" },
          [m === 0 ? "now" : "−" + m + " min"]));
      }
      const line = (cls, pick) => {
        const coords = pts.filter((p) => pick(p) !== null).map((p) => x(p.t).toFixed(1) + "," + y(pick(p)).toFixed(1));
        if (coords.length === 1) {
          // One reading: a short stroke ending now, so it can be seen.
          coords.unshift((x(now) - 8).toFixed(1) + "," + coords[0].split(",")[1]);
        }
        return svg("polyline", { class: cls, points: coords.join(" ") });
      };
      g.push(line("limit", (p) => p.limit));
      g.push(line("drain", (p) => p.drain));
      this.chart.replaceChildren(svg("title", {}, ["Drain rate against the limit, requests per second"]), ...g);

      const latest = pts[pts.length - 1];
      const peak = pts.reduce((m, p) => Math.max(m, p.drain), 0);
      const span = pts.length > 1 ? "last " + duration((now - pts[0].t) / 1000) : "first reading";
      const source = this.seeded ? ", from the drain counts the workers keep and then this page's readings" : " this page has read";
      this.caption.textContent = "Requests per second over the " + span + source +
        ": drain rate now " + rate(latest.drain) + " (peak " + rate(peak) + ")" +
        (latest.limit === null ? "; no limit on requests." : ", limit " + rate(latest.limit) + ".");
    }

    updateLanes(u) {
      const lanes = (u.backlog && u.backlog.lanes) || {};
      const rows = Object.keys(lanes).sort().map((name) => {
        const c = lanes[name];
        const backlog = (c.pending || 0) + (c.scheduled || 0) + (c.retry || 0) + (c.active || 0);
        return el("tr", {}, [
          el("th", { scope: "row" }, [name]),
          ...[c.pending, c.scheduled, c.retry, c.active, backlog, c.dead, c.succeeded].map((v) => el("td", {}, [count(v || 0)])),
        ]);
      });
      this.lanes.replaceChildren(...rows);
    }

    // updateDead re-reads the dead jobs when their count changed, after a
    // retry, or every DEAD_REFRESH_MS; not on every poll, since a list is
    // dearer to read than a count.
    updateDead(u, now) {
      if (page.jobsMissing) {
        this.showJobsMissing();
        return;
      }
      const d = this.dead;
      if (d.inFlight || (!d.stale && d.count === u.dead && now - d.fetchedAt < DEAD_REFRESH_MS)) {
        return;
      }
      this.fetchDead(u.dead);
    }

    async fetchDead(deadCount) {
      const d = this.dead;
      const gen = page.generation;
      d.inFlight = true;
      try {
        const q = "v1/jobs?upstream=" + encodeURIComponent(this.name) + "&state=dead&limit=" + DEAD_LIMIT;
        const data = await api("GET", q);
        if (gen !== page.generation) {
          return;
        }
        d.count = deadCount;
        d.fetchedAt = Date.now();
        d.stale = false;
        this.showDead((data && data.jobs) || [], !!(data && data.next_cursor));
      } catch (err) {
        if (gen !== page.generation) {
          return;
        }
        if ((err.status === 404 && err.title !== "Unknown upstream") || err.status === 405) {
          // No such route: a server without the job listing.
          page.jobsMissing = true;
          for (const card of page.cards.values()) {
            card.showJobsMissing();
          }
          return;
        }
        d.fetchedAt = Date.now();
        this.deadStatus.textContent = "Cannot read the dead jobs: " + err.message;
      } finally {
        d.inFlight = false;
      }
    }

    showJobsMissing() {
      this.deadStatus.textContent = "Job listing not available on this server: it does not answer GET /v1/jobs. The count above is all it reports.";
      this.deadTable.replaceChildren();
      this.dead.ids = "";
    }

    showDead(jobs, more) {
      if (jobs.length === 0) {
        this.deadStatus.textContent = "No dead jobs for this key's tenant.";
      } else {
        this.deadStatus.textContent = (more ? "The newest " + jobs.length + " dead jobs" : jobs.length === 1 ? "One dead job" : jobs.length + " dead jobs") +
          " for this key's tenant" + (more ? "; shaper jobs ls lists the rest." : ".");
      }
      const ids = jobs.map((j) => j.id).join("\n");
      if (ids === this.dead.ids) {
        return; // unchanged: keep the buttons, and the focus on one of them
      }
      this.dead.ids = ids;
      if (jobs.length === 0) {
        this.deadTable.replaceChildren();
        return;
      }
      const rows = jobs.map((j) => {
        const button = el("button", { type: "button", "aria-label": "Retry job " + j.id }, ["Retry"]);
        button.addEventListener("click", () => this.retry(j.id, button));
        return el("tr", {}, [
          el("td", { class: "text mono" }, [j.id]),
          el("td", { class: "text" }, [j.lane || ""]),
          el("td", { class: "text" }, [j.partition || ""]),
          el("td", {}, [String(j.attempts || 0) + (j.max_attempts ? " of " + j.max_attempts : "")]),
          el("td", { class: "text" }, [j.last_error || ""]),
          el("td", { class: "text" }, [j.last_failed_at ? dateTime(j.last_failed_at) : j.completed_at ? dateTime(j.completed_at) : ""]),
          el("td", {}, [button]),
        ]);
      });
      this.deadTable.replaceChildren(el("table", { "data-field": "dead_jobs" }, [
        el("caption", {}, ["Dead jobs of " + this.name + ", newest first"]),
        el("thead", {}, [el("tr", {}, ["Job", "Lane", "Partition", "Attempts", "Last error", "Failed", "Action"]
          .map((t, i) => el("th", { scope: "col", class: i === 0 || i === 1 || i === 2 || i === 4 || i === 5 ? "text" : "" }, [t])))]),
        el("tbody", {}, rows),
      ]));
    }

    async retry(id, button) {
      const gen = page.generation;
      button.disabled = true;
      this.deadMessage.textContent = "";
      try {
        const job = await api("POST", "v1/jobs/" + encodeURIComponent(id) + "/retry");
        if (gen !== page.generation) {
          return;
        }
        this.deadMessage.textContent = "Job " + id + " is " + ((job && job.state) || "queued") + " again.";
      } catch (err) {
        if (gen !== page.generation) {
          return;
        }
        button.disabled = false;
        if (err.status === 401) {
          showLogin("The API refused that key: " + err.message);
          return;
        }
        this.deadMessage.textContent = err.status === 405
          ? "Retry is not available on this server."
          : "Could not retry job " + id + ": " + err.message;
      }
      this.dead.stale = true;
      if (this.last) {
        this.updateDead(this.last, Date.now());
      }
    }
  }

  // ---- what the numbers mean ------------------------------------------------

  // limitPerSecond is the tightest limit on requests, as the fleet paces
  // it now, in requests per second; null when only costs are limited.
  function limitPerSecond(limits) {
    let best = null;
    for (const l of limits || []) {
      if (l.cost) {
        continue;
      }
      const per = goDurationSeconds(l.per);
      if (!(per > 0)) {
        continue;
      }
      const r = (l.effective_rate === undefined ? l.rate : l.effective_rate) / per;
      if (best === null || r < best) {
        best = r;
      }
    }
    return best;
  }

  // goDurationSeconds reads a Go duration string such as "1s" or "1m0s".
  function goDurationSeconds(s) {
    const unit = { ns: 1e-9, us: 1e-6, "µs": 1e-6, "μs": 1e-6, ms: 1e-3, s: 1, m: 60, h: 3600 };
    const re = /([0-9]*\.?[0-9]+)(ns|us|µs|μs|ms|s|m|h)/g;
    let total = 0;
    let m;
    let matched = false;
    while ((m = re.exec(String(s || ""))) !== null) {
      total += parseFloat(m[1]) * unit[m[2]];
      matched = true;
    }
    return matched ? total : NaN;
  }

  function pauseOf(u, now) {
    if (!u.paused_until) {
      return { kind: "running", badge: "running", text: "Running: not paused or blocked." };
    }
    const until = Date.parse(u.paused_until);
    const reason = u.pause_reason || "";
    const operator = reason === "" || reason.startsWith("paused");
    const kind = operator ? "paused" : "blocked";
    const when = until - now > UNTIL_RESUMED_MS
      ? "until resumed"
      : "until " + clock(until) + " (" + duration(Math.max(0, (until - now) / 1000)) + " from now)";
    const why = operator ? (reason ? " (" + reason + ")" : "") : " by the upstream's pushback (" + reason + ")";
    return {
      kind,
      badge: kind,
      text: (operator ? "Paused " : "Blocked ") + when + why + ": nothing is sent; jobs keep queueing.",
    };
  }

  function timeToDrain(u) {
    if (u.time_to_drain_seconds !== null && u.time_to_drain_seconds !== undefined) {
      return duration(u.time_to_drain_seconds);
    }
    if (u.paused_until) {
      return "none while paused";
    }
    return "unknown: nothing drained lately";
  }

  // ---- formatting ----------------------------------------------------------

  function rate(v) {
    return short(v) + "/s";
  }

  function short(v) {
    if (v === 0) {
      return "0";
    }
    const digits = Math.abs(v) >= 100 ? 0 : Math.abs(v) >= 10 ? 1 : 2;
    return String(Number(v.toFixed(digits)));
  }

  function count(n) {
    return Number(n).toLocaleString("en-US");
  }

  function duration(secs) {
    if (!isFinite(secs)) {
      return "—";
    }
    if (secs < 1) {
      return secs === 0 ? "0 s" : "under 1 s";
    }
    const s = Math.round(secs);
    const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), r = s % 60;
    if (h > 0) {
      return h + " h " + m + " min";
    }
    if (m > 0) {
      return m + " min " + r + " s";
    }
    return r + " s";
  }

  function clock(t) {
    return new Date(t).toLocaleTimeString("en-GB", { hour12: false });
  }

  function dateTime(s) {
    const t = Date.parse(s);
    return isNaN(t) ? s : new Date(t).toLocaleString("en-GB", { hour12: false });
  }

  // niceCeil rounds up to a round number (1, 1.2, 1.5, 2, … 8 or 10 times a
  // power of ten), whose half is round too, so the axis reads well; at
  // least 1.
  function niceCeil(v) {
    if (!(v > 1)) {
      return 1;
    }
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 1.2, 1.6, 2, 3, 4, 5, 6, 8, 10]) {
      if (m * p >= v) {
        return m * p;
      }
    }
    return 10 * p;
  }

  // ---- DOM -----------------------------------------------------------------

  function el(tag, attrs, children) {
    return build(document.createElement(tag), attrs, children);
  }

  function svg(tag, attrs, children) {
    return build(document.createElementNS(SVG_NS, tag), attrs, children);
  }

  // build sets attributes and appends children; strings become text
  // nodes, never markup.
  function build(node, attrs, children) {
    for (const [k, v] of Object.entries(attrs || {})) {
      node.setAttribute(k, String(v));
    }
    for (const c of children || []) {
      node.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
    }
    return node;
  }

  start();
})();
