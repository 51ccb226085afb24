// gpuplane console: live updates over server-sent events, and the sign-in form.
// No inline script anywhere (the Content-Security-Policy forbids it); this file is all there is.
(function () {
  "use strict";

  function signIn() {
    var form = document.getElementById("login");
    if (!form) { return; }
    form.addEventListener("submit", function (event) {
      event.preventDefault();
      var token = document.getElementById("token").value.trim();
      if (!token) { return; }
      document.cookie = "gpuplane_token=" + encodeURIComponent(token) + "; path=/; SameSite=Strict";
      window.location.replace(window.location.pathname === "/login" ? "/" : window.location.href);
    });
  }

  // On a new snapshot version, fetch this page again from the console (never from the API
  // server) and swap the main content, keeping the scroll position and open sections.
  function live() {
    var main = document.getElementById("main");
    var badge = document.getElementById("live");
    if (!main || !badge || !window.EventSource) { return; }
    var shown = document.body.getAttribute("data-version");
    var latest = shown;
    var busy = false;

    function refresh() {
      if (busy || latest === shown) { return; }
      busy = true;
      fetch(window.location.href, { credentials: "same-origin", headers: { "Accept": "text/html" } })
        .then(function (response) { return response.ok ? response.text() : null; })
        .then(function (html) {
          if (html === null) { shown = latest; return; }  // refused: wait for the next version
          var page = new DOMParser().parseFromString(html, "text/html");
          var fresh = page.getElementById("main");
          if (!fresh) { shown = latest; return; }
          var closed = [];
          main.querySelectorAll("details:not([open])").forEach(function (d) {
            closed.push(d.getAttribute("data-name"));
          });
          main.replaceChildren.apply(main, Array.prototype.slice.call(fresh.childNodes));
          main.querySelectorAll("details").forEach(function (d) {
            if (closed.indexOf(d.getAttribute("data-name")) >= 0) { d.removeAttribute("open"); }
          });
          shown = page.body.getAttribute("data-version");
          document.body.setAttribute("data-version", shown);
          var version = document.getElementById("version");
          if (version) { version.textContent = shown; }
        })
        .catch(function () { shown = latest; })
        .finally(function () {
          busy = false;
          refresh();  // a version that arrived meanwhile
        });
    }

    var source = new EventSource("/events");
    source.addEventListener("open", function () { badge.classList.add("on"); });
    source.addEventListener("error", function () { badge.classList.remove("on"); });
    source.addEventListener("snapshot", function (event) {
      badge.classList.add("on");
      latest = event.data;
      refresh();
    });
  }

  document.addEventListener("DOMContentLoaded", function () { signIn(); live(); });
}());
