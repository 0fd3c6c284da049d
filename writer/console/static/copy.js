// Copy buttons for the download lines (templates/download_lines.html): the lines are plain text
// on the page, readable and selectable without this script; it only shows the buttons and puts
// a line's text on the clipboard. Text only: nothing from the page is ever run or parsed.
(function () {
  "use strict";
  var status = document.getElementById("copy-status");

  function say(text) { if (status) { status.textContent = text; } }

  function selectText(element) {
    var range = document.createRange();
    range.selectNodeContents(element);
    var selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
  }

  function copied(label) { say("Copied: " + label + "."); }

  function fallback(element, label) {
    // Older browsers, or a page served over plain HTTP to another host (no clipboard API there).
    selectText(element);
    var done = false;
    try { done = document.execCommand("copy"); } catch (error) { done = false; }
    if (done) { copied(label); } else { say("Selected: press Ctrl+C (⌘C on a Mac) to copy it."); }
  }

  Array.prototype.forEach.call(document.querySelectorAll("button.copy[data-copy]"), function (button) {
    var element = document.getElementById(button.getAttribute("data-copy"));
    var label = document.getElementById(button.getAttribute("aria-describedby"));
    if (!element) { return; }
    var name = label ? label.textContent.trim() : "line";
    button.hidden = false;
    button.addEventListener("click", function () {
      var text = element.textContent;
      if (navigator.clipboard && window.isSecureContext) {
        navigator.clipboard.writeText(text).then(function () { copied(name); }, function () { fallback(element, name); });
      } else {
        fallback(element, name);
      }
    });
  });
})();
