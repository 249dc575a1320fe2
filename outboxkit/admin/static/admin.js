/* outboxkit admin: optional enhancements; every page works without this file.
 * Served from the admin itself (the CSP allows script from 'self' only, no inline script).
 * 1. Each time's UTC stamp gets the same moment in the viewer's timezone next to it.
 * 2. A "select all" checkbox for the rows of a page.
 * 3. "Live refresh" on list pages: off until ticked; while on, the page reloads every N seconds, except while the
 *    tab is hidden or the operator is busy on it (rows ticked, a field focused).  The choice is kept for the tab
 *    (sessionStorage, per path), so it survives the reload. */
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
  function liveRefresh() {
    document.querySelectorAll("input[data-live-refresh]").forEach(function (box) {
      var seconds = Math.max(2, parseInt(box.getAttribute("data-live-refresh"), 10) || 10);
      var key = "outboxkit-live:" + location.pathname;
      var timer = null;
      function busy() {
        var active = document.activeElement;
        if (active && active !== box && /^(INPUT|SELECT|TEXTAREA)$/.test(active.tagName)) { return true; }
        return document.querySelector('input[type=checkbox][name="ids"]:checked') !== null;
      }
      function schedule() {
        clearTimeout(timer);
        if (!box.checked) { return; }
        timer = setTimeout(function () {
          if (document.hidden || busy()) { schedule(); return; }
          location.reload();
        }, seconds * 1000);
      }
      try { box.checked = sessionStorage.getItem(key) === "on"; } catch (error) { box.checked = false; }
      box.addEventListener("change", function () {
        try {
          if (box.checked) { sessionStorage.setItem(key, "on"); } else { sessionStorage.removeItem(key); }
        } catch (error) { /* storage refused: the toggle still works for this page */ }
        schedule();
      });
      box.closest("label").hidden = false;
      schedule();
    });
  }
  document.addEventListener("DOMContentLoaded", function () { localTimes(); selectAll(); liveRefresh(); });
})();
