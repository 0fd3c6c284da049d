// A task's events as they happen: the API's live stream (text/event-stream, same origin, the
// session cookie), from the last event the page showed. Each event becomes a table row (text
// only: textContent, never HTML); after each one the task itself is read again for its status
// and budget use. The stream closes once the task is finished.
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
        setText("task-result", status.result === null ? "—" : JSON.stringify(status.result));
        var usage = (status.budget && status.budget.usage) || {};
        Array.prototype.forEach.call(document.querySelectorAll("[data-usage]"), function (used) {
          var counter = used.getAttribute("data-usage");
          if (counter in usage) { used.textContent = String(usage[counter]); }
        });
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
    var data = document.createElement("td");
    data.appendChild(cell("code", JSON.stringify(event.data)));
    row.appendChild(data);
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
