/* outboxkit admin: optional enhancements; every page works without this file.
 * Served from the admin itself (the CSP allows script from 'self' only, no inline script).
 * 1. Each time's UTC stamp gets the same moment in the viewer's timezone next to it.
 * 2. A "select all" checkbox for the rows of a page.
 * 3. "Live refresh" on list pages: off until ticked; while on, the page reloads every N seconds, except while the
 *    tab is hidden or the operator is busy on it (rows ticked, a field focused).  The choice is kept for the tab
 *    (sessionStorage, per path), so it survives the reload.
 * 4. The schedule pages show each fire time in the viewer's timezone too: the server knows it only from ?tz=
 *    (UTC until asked).  While no tz was asked for (the form carries data-viewer-zone-auto), the viewer column
 *    is rewritten in the browser's own IANA timezone and the form is filled with it. */
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
  function zonedText(moment, zone) {
    var parts = {};
    new Intl.DateTimeFormat("en-GB", {
      timeZone: zone, year: "numeric", month: "2-digit", day: "2-digit", hour: "2-digit", minute: "2-digit",
      second: "2-digit", hourCycle: "h23", timeZoneName: "short"
    }).formatToParts(moment).forEach(function (part) { parts[part.type] = part.value; });
    return parts.year + "-" + parts.month + "-" + parts.day + " " + parts.hour + ":" + parts.minute + ":" +
      parts.second + " " + parts.timeZoneName;
  }
  function viewerTimes() {
    var form = document.querySelector("form[data-viewer-zone-auto]");
    var zone = Intl.DateTimeFormat().resolvedOptions().timeZone;
    if (!form || !zone) { return; }
    var field = form.querySelector('input[name="tz"]');
    if (field) { field.value = zone; }
    document.querySelectorAll("[data-viewer-zone-name]").forEach(function (node) { node.textContent = zone; });
    document.querySelectorAll("time[data-viewer-time]").forEach(function (node) {
      var moment = new Date(node.getAttribute("datetime"));
      if (!isNaN(moment.getTime())) { node.textContent = zonedText(moment, zone); }
    });
    document.body.setAttribute("data-viewer-zone", zone);
  }
  document.addEventListener("DOMContentLoaded", function () { localTimes(); selectAll(); liveRefresh(); viewerTimes(); });
})();
