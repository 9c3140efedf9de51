// The explorers' view in the rendered book (mgpu_lib/book/explore.py). Each view holds its
// controls, its panel, and the panel's values for every setting of the controls, computed by
// the library when the page was executed; this script only shows the entry the controls name.
// No kernel, no request.
(function () {
  "use strict";

  function setText(root, key, text) {
    root.querySelectorAll('[data-k="' + key + '"]').forEach(function (el) {
      el.textContent = text;
    });
  }

  function index(form, name) {  // a select's, a radio group's or a range's value: an index
    return Number(form.elements[name].value);
  }

  function fill(select, options) {
    select.replaceChildren.apply(select, options.map(function (text, i) {
      return new Option(String(text), String(i));
    }));
  }

  function range(form, name, text) {
    var input = form.elements[name];
    input.setAttribute("aria-valuetext", text);
    input.closest("label").querySelector("output").textContent = text;
  }

  function gpus(view, data, form) {
    function show() {
      var k = index(form, "n");
      var e = data.grid[index(form, "gpu")][index(form, "link")][index(form, "strategy")]
        [index(form, "mode")][index(form, "batch")][k].split(" ");
      range(form, "n", String(k + 1));
      ["mid", "lo", "hi", "speedup"].forEach(function (key, i) { setText(view, key, e[i]); });
      var parts = e.slice(4, 8);
      var whole = parts.reduce(function (a, p) { return a + parseFloat(p); }, 0) || 1;
      parts.forEach(function (p, i) {
        setText(view, "p" + i, p);
        view.querySelector('[data-part="' + i + '"]').style.width =
          (100 * parseFloat(p) / whole).toFixed(1) + "%";
      });
      setText(view, "total", e[8]);
      setText(view, "note", data.notes[Number(e[9])]);
    }
    form.addEventListener("input", function (event) {
      if (event.target.name === "gpu") fill(form.elements.link, data.links[index(form, "gpu")]);
      // new options start at the first, as the widget's do
      if (event.target.name === "mode") {
        fill(form.elements.batch, data.batches[index(form, "mode")]);
      }
      show();
    });
    show();
  }

  function split(view, data, form) {
    var share = form.elements.share, rec;
    function pick() {
      rec = data.grid[index(form, "gpu")][index(form, "slow")][index(form, "batch")]
        [index(form, "sync")];
      share.max = String(rec.p.length - 1);
    }
    function show() {
      var i = index(form, "share"), e = rec.p[i].split(" ");
      range(form, "share", e[0] + " images");
      ["share", "mid", "lo", "hi", "fast", "slow", "speedup", "gain_lo", "gain_hi"]
        .forEach(function (key, j) {
        setText(view, key, e[j]);
      });
      ["alone", "sync", "best", "xmax", "ymax", "xlabel"].forEach(function (key) {
        setText(view, key, String(rec[key]));
      });
      var at = rec.line.split(" ")[i].split(",");
      view.querySelector('[data-c="line"]').setAttribute("points", rec.line);
      view.querySelector('[data-c="band"]').setAttribute("points", rec.band);
      var best = view.querySelector('[data-c="best"]');
      best.setAttribute("x1", rec.x);
      best.setAttribute("x2", rec.x);
      var dot = view.querySelector('[data-c="dot"]');
      dot.setAttribute("cx", at[0]);
      dot.setAttribute("cy", at[1]);
    }
    form.addEventListener("input", function (event) {
      if (event.target !== share) {
        pick();
        share.value = String(rec.i);
      }
      show();
    });
    pick();
    show();
  }

  function start() {
    document.querySelectorAll(".mgpu-explorer").forEach(function (view) {
      var data = JSON.parse(view.querySelector("script.mgpu-data").textContent);
      var form = view.querySelector("form");
      form.addEventListener("submit", function (event) { event.preventDefault(); });
      ({gpus: gpus, split: split})[view.dataset.explorer](view, data, form);
    });
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
