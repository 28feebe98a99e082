// celery-durable UI: confirmations for actions, and the live refresh of an execution page.
// No inline script anywhere (the CSP forbids it): this file is the only script.
(function () {
  "use strict";
  document.querySelectorAll("form[data-confirm]").forEach(function (form) {
    form.addEventListener("submit", function (event) {
      if (!window.confirm(form.dataset.confirm)) event.preventDefault();
    });
  });
  // the executions list: the rows again every 5 s (the server renders and escapes them; the
  // page's ``live=1`` skips the status counts), paused while rows are selected or the tab hidden
  var list = document.getElementById("list-live");
  if (list) {
    var listState = document.getElementById("list-state");
    var refreshList = function () {
      var busy = document.hidden || list.querySelector('input[type="checkbox"]:checked');
      if (busy) {
        window.setTimeout(refreshList, 5000);
        return;
      }
      var url = new URL(window.location.href);
      url.searchParams.set("live", "1");
      fetch(url.toString(), { credentials: "same-origin", cache: "no-store" })
        .then(function (r) {
          if (!r.ok) throw new Error("HTTP " + r.status);
          return r.text();
        })
        .then(function (html) {
          var fresh = new DOMParser().parseFromString(html, "text/html").getElementById("list-live");
          if (fresh && !list.querySelector('input[type="checkbox"]:checked') && fresh.innerHTML !== list.innerHTML) {
            list.innerHTML = fresh.innerHTML;
          }
          listState.textContent = "live · checked " + new Date().toLocaleTimeString();
        })
        .catch(function (err) {
          listState.textContent = "not refreshed: " + err.message + " (trying again)";
        })
        .finally(function () {
          window.setTimeout(refreshList, 5000);
        });
    };
    window.setTimeout(refreshList, 5000);
  }
  var live = document.getElementById("live");
  if (!live) return;
  var api = live.dataset.api;
  var state = document.getElementById("live-state");
  var ended = ["completed", "failed", "cancelled", "timed_out"];
  var last = null;

  function toggle(status) {
    document.querySelectorAll("[data-when]").forEach(function (el) {
      el.hidden = el.dataset.when.split(" ").indexOf(status) < 0;
    });
  }

  function poll() {
    var delay = 1000;
    fetch(api, { headers: { Accept: "application/json" }, credentials: "same-origin", cache: "no-store" })
      .then(function (r) {
        if (!r.ok) throw new Error("HTTP " + r.status);
        return r.json();
      })
      .then(function (data) {
        // the fragment is rendered (and escaped) by the server: never built from values here
        if (data.html !== last) {
          live.innerHTML = data.html;
          last = data.html;
        }
        live.dataset.status = data.status;
        // what retry and resume would forget now (text: set as a dataset value, never markup)
        Object.keys(data.confirm || {}).forEach(function (action) {
          var form = document.querySelector('form[data-action="' + action + '"]');
          if (form) form.dataset.confirm = data.confirm[action];
        });
        toggle(data.status);
        if (ended.indexOf(data.status) >= 0) delay = 5000; // a retry or resume may reopen it
        state.textContent = "live · checked " + new Date().toLocaleTimeString();
      })
      .catch(function (err) {
        state.textContent = "not refreshed: " + err.message + " (trying again)";
      })
      .finally(function () {
        window.setTimeout(poll, delay);
      });
  }
  window.setTimeout(poll, 1000);
})();
