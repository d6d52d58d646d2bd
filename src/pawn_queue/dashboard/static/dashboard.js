// pawn-queue dashboard: asks the server whether the queue changed, and swaps in the page's
// fresh <main> when it did. The server reads again what this page shows once it is a refresh
// interval old (acks signal nothing), and answers from memory otherwise. No data is put into
// the page here but the server's escaped HTML and text through textContent.
(function () {
  "use strict";
  var body = document.body;
  var every = Number(body.dataset.refresh) || 2000;
  var version = body.dataset.version;
  var lastSwap = Date.now();
  var AGES_EVERY_MS = 10000; // ages grow without a change: redraw them now and then

  function setText(id, value) {
    var element = document.getElementById(id);
    if (element) {
      element.textContent = String(value);
    }
  }

  function selecting() {
    // A dead letter being selected: leave the page alone.
    return document.querySelector("main input[type=checkbox]:checked") !== null;
  }

  function swap() {
    return fetch(location.href, { headers: { "X-Fragment": "1" }, credentials: "same-origin" })
      .then(function (response) {
        if (!response.ok) {
          return false;
        }
        return response.text().then(function (html) {
          document.getElementById("main").innerHTML = html;
          lastSwap = Date.now();
          return true;
        });
      });
  }

  function tick() {
    var url = "/api/state?page=" + encodeURIComponent(location.pathname);
    fetch(url, { credentials: "same-origin", cache: "no-store" })
      .then(function (response) {
        return response.ok ? response.json() : null;
      })
      .then(function (state) {
        if (!state) {
          return null;
        }
        setText("cost-summary", state.cost.summary);
        setText("cost-total", state.cost.total);
        setText("cost-idle", state.idle_per_minute);
        setText("cost-open", state.open_per_minute);
        setText("cost-full", state.full_refresh_requests);
        var changed = String(state.version) !== version;
        var stale = Date.now() - lastSwap > AGES_EVERY_MS;
        if (body.dataset.live === "1" && !selecting() && (changed || stale)) {
          return swap().then(function (done) {
            if (done) {
              version = String(state.version);
            }
          });
        }
        return null;
      })
      .catch(function () {
        // The dashboard is away for a moment: the next tick tries again.
      })
      .then(function () {
        window.setTimeout(tick, every);
      });
  }

  window.setTimeout(tick, every);
})();
