// A task's events as they happen: the API's live stream (text/event-stream, same origin, the
// session cookie), from the last event the page showed. Each event becomes a table row with the
// sentence the server writes for it (writer/console/task_progress.py `sentence`: keep the two in
// step), as text only (textContent, never HTML); after each one the task itself is read again for
// its status, budget use and progress bar. The stream closes once the task is finished.
(function () {
  "use strict";
  var task = document.getElementById("task");
  var body = document.querySelector("#events tbody");
  if (!task || !body || !window.EventSource) { return; }
  var id = task.getAttribute("data-task");
  var after = task.getAttribute("data-after") || "0";
  var state = document.getElementById("events-state");
  var TYPES = ["task.queued", "task.loading", "task.running", "task.progress", "task.checkpoint",
               "task.cancelling", "task.completed", "task.failed", "task.cancelled"];
  var FINISHED = {"task.completed": true, "task.failed": true, "task.cancelled": true};
  var seen = {};
  Array.prototype.forEach.call(body.querySelectorAll("tr[data-seq]"), function (row) {
    seen[row.getAttribute("data-seq")] = true;
  });

  function utc(iso) {
    var moment = new Date(iso);
    if (isNaN(moment.getTime())) { return String(iso); }
    return moment.toISOString().replace("T", " ").slice(0, 19) + " UTC";
  }

  function cell(tag, text) {
    var element = document.createElement(tag);
    element.textContent = text;
    return element;
  }

  function say(text) { if (state) { state.textContent = text; } }

  // -- the sentences (task_progress.py) -------------------------------------------------------
  function number(value) {
    if (value === null || value === undefined || typeof value === "boolean") { return JSON.stringify(value === undefined ? null : value); }
    if (typeof value === "number" || typeof value === "string") { return String(value); }
    return JSON.stringify(value);
  }

  function flat(value, prefix) {
    if (value && typeof value === "object" && !Array.isArray(value) && Object.keys(value).length) {
      var pairs = [];
      Object.keys(value).sort().forEach(function (key) { pairs = pairs.concat(flat(value[key], prefix + key + ".")); });
      return pairs;
    }
    return [prefix.slice(0, -1) + " " + number(value)];
  }

  var USAGE_WORDS = [["items", "items"], ["bytes", "bytes"], ["cost_units", "cost units"]];
  function usageWords(usage) {
    if (!usage || typeof usage !== "object") { return ""; }
    return USAGE_WORDS.filter(function (pair) { return usage[pair[0]]; })
      .map(function (pair) { return pair[1] + " " + number(usage[pair[0]]); }).join(", ");
  }

  function pairs(value) {
    if (value === null || value === undefined) { return "—"; }
    if (typeof value === "object" && !Array.isArray(value)) {
      return Object.keys(value).length ? flat(value, "").join(", ") : "none";
    }
    return number(value);
  }

  function sentence(event) {
    var data = (event.data && typeof event.data === "object" && !Array.isArray(event.data)) ? event.data : {};
    var by = typeof data.by === "string" ? " by " + data.by : "";
    switch (event.type) {
      case "task.queued":
        if ("recovered_from" in data) { return "Queued again after a worker restart (it was " + number(data.recovered_from) + ")."; }
        return "Queued: waiting for a worker.";
      case "task.loading": return "A worker took it.";
      case "task.running": return data.resumed ? "Running again from its last checkpoint, after a worker restart." : "Running.";
      case "task.progress":
        var message = typeof data.message === "string" ? data.message : "Progress";
        var used = usageWords(data.usage);
        return used ? message + " (so far: " + used + ")." : message + ".";
      case "task.checkpoint": return "Checkpoint saved (" + number(data.state_bytes) + " bytes of state).";
      case "task.cancelling": return "Cancel asked" + by + ": it stops at its next step.";
      case "task.cancelled": return "Cancelled" + by + ".";
      case "task.completed":
        var result = data.result;
        return (result && typeof result === "object" && !Array.isArray(result) && Object.keys(result).length)
          ? "Completed: " + pairs(result) + "." : "Completed.";
      case "task.failed": return "Failed: " + number(data.error_code) + ": " + number(data.error_message) + ".";
      default: return number(event.type) + ": " + number(data);
    }
  }

  // -- the progress bar (task_progress.py `progress`) -------------------------------------------
  var bar = document.getElementById("task-progress");
  var barText = document.getElementById("task-progress-text");
  function showProgress(status) {
    if (!bar || !barText) { return; }
    var counter = bar.getAttribute("data-counter");
    var usage = (status.budget && status.budget.usage) || {};
    if (status.status === "completed") {
      bar.max = 1; bar.value = 1; barText.textContent = "Completed."; return;
    }
    var finished = status.status === "failed" || status.status === "cancelled";
    if (!counter) {
      if (finished) { bar.max = 1; bar.value = 0; barText.textContent = "Stopped (" + status.status + ")."; }
      else if (status.status !== "queued") {
        barText.textContent = status.status.charAt(0).toUpperCase() + status.status.slice(1) + ": " +
          bar.getAttribute("data-kind") + " reports its steps below, not a total.";
      }
      return;
    }
    var done = Number(usage[counter] || 0);
    var top = Math.max(Number(bar.getAttribute("data-total")) || 0, done, 1);
    var words = done + " of " + top + " " + bar.getAttribute("data-unit") + " (" + Math.floor(done * 100 / top) + " %)";
    bar.max = top; bar.value = done;
    if (status.status === "queued") { words = "Queued: waiting for a worker."; }
    else if (finished) { words = "Stopped (" + status.status + ") at " + words + "."; }
    barText.textContent = words;
  }

  function setText(elementId, text) {
    var element = document.getElementById(elementId);
    if (element) { element.textContent = text; }
  }

  var refreshing = false, again = false;
  function refresh() {
    if (refreshing) { again = true; return; }
    refreshing = true;
    fetch("/api/v1/tasks/" + encodeURIComponent(id), {credentials: "same-origin", headers: {"Accept": "application/json"}})
      .then(function (answer) { return answer.ok ? answer.json() : null; })
      .then(function (status) {
        if (!status) { return; }
        setText("task-status", status.status);
        setText("task-attempts", status.attempts + " of at most " + status.max_attempts);
        setText("task-started", status.started_at ? utc(status.started_at) : "—");
        setText("task-finished", status.finished_at ? utc(status.finished_at) : "—");
        setText("task-error", status.error ? status.error.code + ": " + status.error.message : "—");
        setText("task-result", pairs(status.result));
        var usage = (status.budget && status.budget.usage) || {};
        Array.prototype.forEach.call(document.querySelectorAll("[data-usage]"), function (used) {
          var counter = used.getAttribute("data-usage");
          if (counter in usage) { used.textContent = String(usage[counter]); }
        });
        showProgress(status);
        if (status.finished_at) {
          var cancel = document.getElementById("cancel-form");
          if (cancel) { cancel.hidden = true; }
        }
      })
      .catch(function () {})
      .then(function () {
        refreshing = false;
        if (again) { again = false; refresh(); }
      });
  }

  var source = new EventSource("/api/v1/tasks/" + encodeURIComponent(id) + "/events?after=" + encodeURIComponent(after));
  say("Following the task live.");

  function onEvent(message) {
    var event;
    try { event = JSON.parse(message.data); } catch (error) { return; }
    if (seen[String(event.seq)]) { return; }
    seen[String(event.seq)] = true;
    var row = document.createElement("tr");
    row.setAttribute("data-seq", String(event.seq));
    row.setAttribute("data-live", "true");
    row.appendChild(cell("th", String(event.seq))).setAttribute("scope", "row");
    row.appendChild(cell("td", event.type));
    row.appendChild(cell("td", utc(event.created_at)));
    row.appendChild(cell("td", sentence(event)));
    body.appendChild(row);
    refresh();
    if (FINISHED[event.type]) {
      source.close();
      say("The task is finished; these are all its events.");
    }
  }

  TYPES.forEach(function (type) { source.addEventListener(type, onEvent); });
  source.onmessage = onEvent;
  source.onerror = function () {
    if (source.readyState === EventSource.CLOSED) { say("The live stream ended: reload the page to see newer events."); }
    else { say("The live stream was cut; reconnecting."); }
  };
})();
