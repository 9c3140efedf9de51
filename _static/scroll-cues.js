/* A table wider than its column scrolls in the theme's .pst-scrollable-table-container; on a
 * phone no scrollbar shows until one scrolls. This marks each such box with where more of the
 * table lies (data-more="right", "left" or "both"; none when it all fits), and custom.css fades
 * that edge. Kept up to date as the reader scrolls and as the box or the table changes size.
 * tools/check_layout.py reports a table that scrolls at 400 px with nothing showing it.
 */
(function () {
  "use strict";
  var SLACK = 2;  // px: a table within 2 px of its box fits

  function mark(box) {
    var over = box.scrollWidth - box.clientWidth;
    var left = over > SLACK && box.scrollLeft > SLACK;
    var right = over > SLACK && box.scrollLeft < over - SLACK;
    var more = left && right ? "both" : left ? "left" : right ? "right" : "";
    if (more) box.setAttribute("data-more", more);
    else box.removeAttribute("data-more");
  }

  function start() {
    var boxes = document.querySelectorAll(".bd-article .pst-scrollable-table-container");
    var resized = window.ResizeObserver && new ResizeObserver(function (entries) {
      entries.forEach(function (entry) {
        mark(entry.target.closest(".pst-scrollable-table-container") || entry.target);
      });
    });
    boxes.forEach(function (box) {
      box.addEventListener("scroll", function () { mark(box); }, {passive: true});
      if (resized) {
        resized.observe(box);
        if (box.firstElementChild) resized.observe(box.firstElementChild);
      }
      mark(box);
    });
    window.addEventListener("resize", function () { boxes.forEach(mark); });
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
