/* outboxkit admin: optional enhancements; every page works without this file.
 * Served from the admin itself (the CSP allows script from 'self' only, no inline script).
 * 1. Each time's UTC stamp gets the same moment in the viewer's timezone next to it.
 * 2. A "select all" checkbox for the rows of a page. */
(function () {
  "use strict";
  function pad(n) { return String(n).padStart(2, "0"); }
  function localTimes() {
    var zone = Intl.DateTimeFormat().resolvedOptions().timeZone || "local";
    if (zone === "UTC" || zone === "Etc/UTC") { return; }
    document.querySelectorAll("span.when > time[datetime]").forEach(function (node) {
      var moment = new Date(node.getAttribute("datetime"));
      if (isNaN(moment.getTime()) || node.parentNode.querySelector(".local")) { return; }
      var text = moment.getFullYear() + "-" + pad(moment.getMonth() + 1) + "-" + pad(moment.getDate()) + " " +
        pad(moment.getHours()) + ":" + pad(moment.getMinutes()) + ":" + pad(moment.getSeconds()) + " " + zone;
      var local = document.createElement("span");
      local.className = "local";
      local.textContent = text;
      node.parentNode.appendChild(local);
    });
  }
  function selectAll() {
    document.querySelectorAll("input[data-select-all]").forEach(function (master) {
      var form = master.form;
      var name = master.getAttribute("data-select-all");
      master.hidden = false;
      master.addEventListener("change", function () {
        form.querySelectorAll('input[type=checkbox][name="' + name + '"]').forEach(function (box) { box.checked = master.checked; });
      });
    });
  }
  document.addEventListener("DOMContentLoaded", function () { localTimes(); selectAll(); });
})();
