// The per-question table and drill-down of report.html: plain DOM, no dependencies, no requests.
(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("report-data").textContent);
  var S = D.strings, Q = D.questions, M = D.metrics, R = D.runs;
  var BASE = R.indexOf(D.baseline);
  var $ = function (id) { return document.getElementById(id); };
  var ESC = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
  function esc(s) { return String(s == null ? "" : s).replace(/[&<>"']/g, function (c) { return ESC[c]; }); }
  function str(i) { return i == null || i < 0 ? "" : S[i]; }
  function metricIndex(name) { for (var i = 0; i < M.length; i++) if (M[i].name === name) return i; return -1; }
  function fmt(v, m) { return v == null ? "–" : v.toFixed(M[m].decimals); }
  function val(q, r, m) { var x = q.runs[r]; return x && m >= 0 ? x.metrics[m] : null; }

  var state = { a: metricIndex(D.key[0]), b: D.key.length > 1 ? metricIndex(D.key[1]) : -1, sort: null, dir: 1,
                order: Q.map(function (_, i) { return i; }), visible: [], open: -1 };

  // +1 the run beats the baseline on metric m for question q, -1 it loses, 0 tie, null unknown.
  function outcome(q, r, m) {
    if (BASE < 0 || r === BASE) return null;
    var v = val(q, r, m), b = val(q, BASE, m);
    if (v == null || b == null) return null;
    var d = M[m].higher_is_better ? v - b : b - v;
    return d > 1e-12 ? 1 : d < -1e-12 ? -1 : 0;
  }

  function option(value, text) { var o = document.createElement("option"); o.value = value; o.textContent = text; return o; }

  function initControls() {
    var corpora = {};
    Q.forEach(function (q) { corpora[q.corpus] = (corpora[q.corpus] || 0) + 1; });
    Object.keys(corpora).sort().forEach(function (c) { $("f-corpus").appendChild(option(c, c + " (" + corpora[c] + ")")); });
    M.forEach(function (m, i) {
      $("f-metric-a").appendChild(option(i, m.short));
      $("f-metric-b").appendChild(option(i, m.short));
    });
    $("f-metric-b").insertBefore(option(-1, "nothing else"), $("f-metric-b").firstChild);
    $("f-metric-a").value = state.a; $("f-metric-b").value = state.b;
    R.forEach(function (r, i) { if (i !== BASE) $("f-run").appendChild(option(i, r)); });
    if (BASE < 0) { document.querySelector(".wl").style.display = "none"; }
    (D.fault_classes || []).forEach(function (c, i) { $("f-class").appendChild(option(i, c)); });
    if (BASE < 0) { $("f-trans").parentNode.style.display = "none"; }
    ["f-corpus", "f-run", "f-outcome", "f-class", "f-trans"].forEach(function (id) { $(id).addEventListener("change", applyFilters); });
    $("f-text").addEventListener("input", applyFilters);
    $("f-metric-a").addEventListener("change", function () { state.a = +this.value; renderTable(); });
    $("f-metric-b").addEventListener("change", function () { state.b = +this.value; renderTable(); });
  }

  function columns() {
    var cols = [{ key: "id", label: "id" }, { key: "corpus", label: "corpus" }, { key: "question", label: "question" }];
    [state.a, state.b].forEach(function (m) {
      if (m < 0) return;
      R.forEach(function (r, i) { cols.push({ key: "m", run: i, metric: m, label: r + " · " + M[m].short }); });
    });
    return cols;
  }

  function renderTable() {
    var cols = columns();
    var head = "<tr>" + cols.map(function (c, j) {
      var cls = state.sort === j ? (state.dir > 0 ? "sorted-asc" : "sorted-desc") : "";
      return '<th data-col="' + j + '" class="' + cls + '" title="click to sort">' + esc(c.label) + "</th>";
    }).join("") + "</tr>";
    document.querySelector("#qtable thead").innerHTML = head;
    var rows = new Array(Q.length);
    for (var i = 0; i < Q.length; i++) {
      var q = Q[i], cells = ["<td>" + esc(q.id) + "</td><td>" + esc(q.corpus) + '</td><td class="q">' + esc(q.question) + "</td>"];
      for (var j = 3; j < cols.length; j++) {
        var c = cols[j], o = outcome(q, c.run, c.metric);
        cells.push('<td class="num' + (o === 1 ? " win" : o === -1 ? " lose" : "") + '">' + fmt(val(q, c.run, c.metric), c.metric) + "</td>");
      }
      rows[i] = '<tr data-i="' + i + '">' + cells.join("") + "</tr>";
    }
    var body = document.querySelector("#qtable tbody");
    body.innerHTML = rows.join("");
    state.rows = Array.prototype.slice.call(body.children);
    if (state.sort !== null) sortBy(state.sort, true); else applyFilters();
  }

  function sortKey(c, q) {
    if (c.key === "m") { var v = val(q, c.run, c.metric); return v == null ? -Infinity : v; }
    return String(q[c.key] || "").toLowerCase();
  }

  function sortBy(j, keep) {
    if (!keep) { state.dir = state.sort === j ? -state.dir : 1; state.sort = j; }
    var c = columns()[j], dir = state.dir;
    state.order = Q.map(function (_, i) { return i; }).sort(function (x, y) {
      var a = sortKey(c, Q[x]), b = sortKey(c, Q[y]);
      return (a < b ? -1 : a > b ? 1 : x - y) * dir;
    });
    var body = document.querySelector("#qtable tbody"), frag = document.createDocumentFragment();
    state.order.forEach(function (i) { frag.appendChild(state.rows[i]); });
    body.appendChild(frag);
    document.querySelectorAll("#qtable thead th").forEach(function (th, k) {
      th.className = k === j ? (dir > 0 ? "sorted-asc" : "sorted-desc") : "";
    });
    applyFilters();
  }

  function matches(q) {
    var corpus = $("f-corpus").value, text = $("f-text").value.trim().toLowerCase();
    if (corpus && q.corpus !== corpus) return false;
    if (text && (q.id + "\n" + q.question + "\n" + (q.ground_truth || "")).toLowerCase().indexOf(text) < 0) return false;
    var run = $("f-run").value, want = $("f-outcome").value, cls = $("f-class").value, trans = $("f-trans").value;
    if (run === "" && want === "" && cls === "" && trans === "") return true;
    // The fault class and the change (fixed/broken against the baseline) apply to the run chosen
    // under "Questions where", or to any run; the class also to the baseline.
    var runs = run === "" ? R.map(function (_, i) { return i; }).filter(function (i) { return i !== BASE || want === "" && trans === ""; }) : [+run];
    return runs.some(function (r) {
      var x = q.runs[r];
      if (cls !== "" && !(x && x.fault === +cls)) return false;
      if (trans !== "" && !(x && x.change === +trans)) return false;
      if (want === "") return true;
      var o = outcome(q, r, state.a);
      if (o === null) return false;
      return want === "win" ? o === 1 : want === "lose" ? o === -1 : want === "tie" ? o === 0 : o !== 0;
    });
  }

  function applyFilters() {
    var shown = [];
    state.order.forEach(function (i) {
      var ok = matches(Q[i]);
      state.rows[i].style.display = ok ? "" : "none";
      if (ok) shown.push(i);
    });
    state.visible = shown;
    $("count").textContent = "showing " + shown.length + " of " + Q.length + " questions";
  }

  function highlighted(text, span) {
    if (!span || span[1] <= span[0]) return esc(text);
    return esc(text.slice(0, span[0])) + "<mark>" + esc(text.slice(span[0], span[1])) + "</mark>" + esc(text.slice(span[1]));
  }

  function badge(text, yes) { return '<span class="badge ' + (yes === true ? "yes" : yes === false ? "no" : "") + '">' + esc(text) + "</span>"; }

  function labelBadges(labels) {
    if (!labels) return "";
    return Object.keys(labels).map(function (k) {
      var v = labels[k];
      if (typeof v === "boolean") return badge(k + (v ? " ✓" : " ✗"), v);
      return badge(k + ": " + v, typeof v === "number" ? v > 0 : null);
    }).join(" ");
  }

  // The ranked chunks and the LLM's contexts come as tables by column: entry i of each list.
  function retrievedHtml(t, i) {
    var doc = str(t.doc_id[i]), score = t.score[i], sim = t.sim_to_truth[i];
    var hdr = "<b>#" + t.rank[i] + "</b><span>" + esc(D.docs[doc] || doc) + '</span><span title="chunk id">' + esc(str(t.chunk_id[i])) + "</span>" +
      "<span>score " + (score == null ? "–" : score.toFixed(4)) + "</span><span>sim " + (sim == null ? "–" : sim.toFixed(3)) + "</span>" +
      badge("relevant (sim ≥ " + D.tau_recall + ")" + (t.relevant[i] ? " ✓" : " ✗"), t.relevant[i]) + " " + labelBadges(D.labels[t.labels[i]]);
    return '<div class="ctx"><div class="hdr">' + hdr + '</div><div class="txt">' + highlighted(str(t.text[i]), t.span[i]) + "</div></div>";
  }

  function givenHtml(t, i) {
    return '<div class="ctx"><div class="hdr"><b>[' + (i + 1) + "]</b><span>" + esc(t.label[i]) + '</span></div><div class="txt">' +
      highlighted(str(t.text[i]), t.span[i]) + "</div></div>";
  }

  function rows(t, html) { return t.text.map(function (_, i) { return html(t, i); }).join(""); }

  function metricsTable(q) {
    var head = "<tr><th>metric</th>" + R.map(function (r) { return "<th>" + esc(r) + (R.indexOf(r) === BASE ? " (baseline)" : "") + "</th>"; }).join("") + "</tr>";
    var rows = M.map(function (m, k) {
      var vals = R.map(function (_, r) { return val(q, r, k); }), known = vals.filter(function (v) { return v != null; });
      var best = known.length ? (m.higher_is_better ? Math.max.apply(null, known) : Math.min.apply(null, known)) : null;
      return "<tr><th>" + esc(m.short) + "</th>" + vals.map(function (v) {
        var tie = known.every(function (x) { return x === best; });
      return '<td class="' + (v != null && v === best && !tie ? "best" : "") + '">' + fmt(v, k) + "</td>";
      }).join("") + "</tr>";
    });
    return '<table class="qmetrics">' + head + rows.join("") + "</table>";
  }

  function runHtml(q, r) {
    var x = q.runs[r];
    var h = "<h4>" + esc(R[r]) + (r === BASE ? ' <span class="tag">baseline</span>' : "") + "</h4>";
    if (!x) return '<div class="run">' + h + "<p>not in this run</p></div>";
    var lat = Object.keys(x.latency_ms || {}).map(function (k) { return k + " " + x.latency_ms[k] + " ms"; }).join(", ");
    if (lat) h += '<div class="note">latency: ' + esc(lat) + "</div>";
    if (x.answer >= 0) h += "<div><b>Answer</b></div><div class=\"answer\">" + esc(str(x.answer)) + "</div>";
    h += "<div><b>Ranked contexts</b> (" + x.retrieved.text.length + ")</div>" + rows(x.retrieved, retrievedHtml);
    if (x.contexts.text.length) {
      h += "<details><summary>Contexts given to the LLM (" + x.contexts.text.length + ")</summary>" + rows(x.contexts, givenHtml) + "</details>";
    }
    return '<div class="run">' + h + "</div>";
  }

  function openQuestion(i) {
    var q = Q[i];
    if (!q) return;
    state.open = i;
    $("d-title").textContent = q.id + " · " + q.corpus;
    var src = q.source_id ? "<p>Source: <b>" + esc(q.source) + "</b> <small>(" + esc(q.source_id) + ")</small></p>" : "";
    $("d-body").innerHTML = '<div class="qhead"><div class="qinfo"><p class="qtext">' + esc(q.question) +
      '</p><div class="truth"><b>Ground truth.</b> ' + esc(q.ground_truth) + "</div>" + src + "</div>" + metricsTable(q) + "</div>" +
      '<div class="runs" style="grid-template-columns: repeat(' + R.length + ', minmax(320px, 1fr))">' +
      R.map(function (_, r) { return runHtml(q, r); }).join("") + "</div>";
    $("detail").hidden = false;
    $("d-body").scrollTop = 0;
    if (location.hash !== "#q=" + encodeURIComponent(q.id)) history.replaceState(null, "", "#q=" + encodeURIComponent(q.id));
  }

  function closeQuestion() {
    $("detail").hidden = true;
    state.open = -1;
    history.replaceState(null, "", "#questions");
  }

  function step(d) {
    var pos = state.visible.indexOf(state.open);
    var next = state.visible[pos + d];
    if (next !== undefined) openQuestion(next);
  }

  function initEvents() {
    document.querySelector("#qtable thead").addEventListener("click", function (ev) {
      var th = ev.target.closest("th");
      if (th) sortBy(+th.dataset.col);
    });
    document.querySelector("#qtable tbody").addEventListener("click", function (ev) {
      var tr = ev.target.closest("tr");
      if (tr) openQuestion(+tr.dataset.i);
    });
    $("d-close").addEventListener("click", closeQuestion);
    $("d-prev").addEventListener("click", function () { step(-1); });
    $("d-next").addEventListener("click", function () { step(1); });
    document.addEventListener("keydown", function (ev) {
      if ($("detail").hidden) return;
      if (ev.key === "Escape") closeQuestion();
      else if (ev.key === "ArrowRight") step(1);
      else if (ev.key === "ArrowLeft") step(-1);
    });
    var m = /^#q=(.*)$/.exec(location.hash);
    if (m) {
      var id = decodeURIComponent(m[1]);
      for (var i = 0; i < Q.length; i++) if (Q[i].id === id) { openQuestion(i); break; }
    }
  }

  initControls();
  renderTable();
  initEvents();
  window.reportReadyMs = performance.now();
  document.documentElement.setAttribute("data-ready", "1");
})();
