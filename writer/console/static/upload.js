// The upload form with progress: the browser uses the resumable upload API itself (create a
// session, send the file's bytes, complete), authorized by the session cookie and carrying the
// page's CSRF token in X-CSRF-Token, as every cookie-authorized change to the API must. A cut
// transfer is sent again (the parts the writer recorded are only compared, not stored twice).
// Without this script the same form posts the file to the console, with no progress shown.
(function () {
  "use strict";
  var form = document.getElementById("upload-form");
  if (!form || !window.XMLHttpRequest || !window.fetch || !window.Promise) { return; }
  var repository = form.getAttribute("data-repository");
  var csrf = form.querySelector('input[name="csrf"]').value;
  var key = form.querySelector('input[name="key"]').value;
  var fileInput = form.querySelector('input[type="file"]');
  var nameInput = form.querySelector('input[name="name"]');
  var button = form.querySelector('button[type="submit"]');
  var progress = document.getElementById("upload-progress");
  var status = document.getElementById("upload-status");
  var uploads = "/api/v1/repositories/" + encodeURIComponent(repository) + "/uploads";
  var TRIES = 4;

  function say(text) { status.textContent = text; }

  function refusal(statusCode, text) {
    try {
      var answer = JSON.parse(text);
      return new Error(answer.message + " (" + answer.code + ", " + statusCode + ")");
    } catch (error) {
      return new Error("the server answered " + statusCode);
    }
  }

  function api(method, path, body, headers) {
    var sent = {"X-CSRF-Token": csrf, "Accept": "application/json"};
    Object.keys(headers || {}).forEach(function (name) { sent[name] = headers[name]; });
    return fetch(path, {method: method, credentials: "same-origin", headers: sent, body: body})
      .then(function (answer) {
        return answer.text().then(function (text) {
          if (!answer.ok) { throw refusal(answer.status, text); }
          return text ? JSON.parse(text) : null;
        });
      });
  }

  function sendContent(session, file, attempt) {
    return new Promise(function (resolve, reject) {
      var request = new XMLHttpRequest();
      request.open("PUT", uploads + "/" + encodeURIComponent(session.id) + "/content");
      request.setRequestHeader("Content-Type", "application/octet-stream");
      request.setRequestHeader("X-CSRF-Token", csrf);
      request.upload.onprogress = function (event) {
        if (event.lengthComputable && event.total > 0) {
          var percent = Math.floor(event.loaded * 100 / event.total);
          progress.value = percent;
          say("Sending: " + percent + " % of " + file.size + " bytes");
        }
      };
      request.onload = function () {
        if (request.status >= 200 && request.status < 300) { resolve(session); }
        else { reject(refusal(request.status, request.responseText)); }
      };
      request.onerror = function () {
        if (attempt + 1 >= TRIES) { reject(new Error("the connection was cut " + TRIES + " times")); return; }
        say("The connection was cut; sending again…");
        window.setTimeout(function () {
          sendContent(session, file, attempt + 1).then(resolve, reject);
        }, 1000 * (attempt + 1));
      };
      request.send(file);
    });
  }

  form.addEventListener("submit", function (event) {
    var file = fileInput.files && fileInput.files[0];
    if (!file) { return; }  // the browser's own check of `required` speaks
    event.preventDefault();
    var descriptor = {name: nameInput.value || file.name, size: file.size};
    if (file.type) { descriptor.mediaType = file.type; }
    button.disabled = true;
    progress.hidden = false;
    progress.value = 0;
    say("Starting the upload…");
    api("POST", uploads, JSON.stringify(descriptor), {"Content-Type": "application/json", "Idempotency-Key": key})
      .then(function (session) { return sendContent(session, file, 0); })
      .then(function (session) {
        say("Checking the whole file…");
        return api("POST", uploads + "/" + encodeURIComponent(session.id) + "/complete", null, {});
      })
      .then(function (artifact) {
        progress.value = 100;
        say("Uploaded.");
        window.location.assign("/console/repositories/" + encodeURIComponent(repository) +
                               "/artifacts/" + encodeURIComponent(artifact.id) + "?notice=uploaded");
      })
      .catch(function (error) {
        say("The upload failed: " + error.message);
        button.disabled = false;
      });
  });
})();
