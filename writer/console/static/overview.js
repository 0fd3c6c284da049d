// The overview's live cells: every two seconds, /console/overview.json (same origin, the session
// cookie) gives each process's trust left, status, reservation and granted bytes. Text only:
// values are set with textContent, never parsed as HTML.
(function () {
  "use strict";
  var EVERY_MS = 2000;
  var previous = {};

  function seconds(value) {
    return typeof value === "number" ? Math.max(0, value).toFixed(1) + " s" : "—";
  }

  function bytes(value) {
    if (typeof value !== "number") { return "—"; }
    var units = ["B", "KiB", "MiB", "GiB", "TiB"], amount = value, unit = 0;
    while (amount >= 1024 && unit < units.length - 1) { amount /= 1024; unit += 1; }
    return unit === 0 ? value + " B" : amount.toFixed(1) + " " + units[unit] + " (" + value + " B)";
  }

  function set(row, field, text) {
    var cell = row.querySelector('[data-field="' + field + '"]');
    if (cell && cell.textContent !== text) { cell.textContent = text; }
  }

  function update(data) {
    var now = Date.now();
    data.processes.forEach(function (process) {
      var rows = document.querySelectorAll('tr[data-process="' + process.key + '"]');
      rows.forEach(function (row) {
        set(row, "trustLeft", process.trustLeft === null ? "—" : seconds(process.trustLeft));
        set(row, "status", process.status || "—");
        if (process.reservationLeft !== null) {
          set(row, "reservationLeft", process.reservationLeft > 0 ? seconds(process.reservationLeft) : "expired");
        }
        if (process.generation !== null) { set(row, "generation", String(process.generation)); }
        if (process.renewedAt) { set(row, "renewedAt", process.renewedAt); }
        if (process.shareMode === "demand" && typeof process.bytesPerSecond === "number") {
          var demand = process.demandBytesPerSecond ? bytes(process.demandBytesPerSecond) + "/s" : "none";
          set(row, "share", bytes(process.bytesPerSecond) + "/s (demand " + demand + ")");
        }
        if (typeof process.grantedBytes === "number") {
          set(row, "grantedBytes", bytes(process.grantedBytes));
          var before = previous[process.key];
          if (before && now > before.at) {
            var perSecond = Math.max(0, (process.grantedBytes - before.bytes) * 1000 / (now - before.at));
            set(row, "rate", bytes(Math.round(perSecond)) + "/s");
          }
          previous[process.key] = {at: now, bytes: process.grantedBytes};
        }
      });
    });
    var worker = document.getElementById("worker-state");
    if (worker) {
      worker.textContent = data.workerActive
        ? "A worker is active (it holds the worker lock)."
        : "No worker is active: queued tasks wait.";
    }
  }

  function poll() {
    fetch("/console/overview.json", {credentials: "same-origin", headers: {"Accept": "application/json"}})
      .then(function (answer) {
        if (!answer.ok || answer.redirected) { throw new Error("overview " + answer.status); }
        return answer.json();
      })
      .then(function (data) { update(data); window.setTimeout(poll, EVERY_MS); })
      .catch(function () { window.setTimeout(poll, EVERY_MS * 5); });
  }

  if (window.fetch && document.getElementById("leases")) { poll(); }
})();
