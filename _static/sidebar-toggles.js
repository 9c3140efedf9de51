/* The sidebar toggles a reader can see, made to work.
 *
 * pydata-sphinx-theme 0.17.1 (which sphinx-book-theme 1.3.0 pins) binds its click handlers to
 * document.querySelector(".primary-toggle") and (".secondary-toggle"): the first such button in
 * the page, which is the theme's top-bar button (hidden: sphinx-book-theme hides it and
 * custom.css hides the whole bar). The visible buttons, in the article header, get no handler:
 * on a phone or any window under 992 px the chapter list and the contents cannot be opened, and
 * on a wide window the sidebar cannot be collapsed (sphinx-book-theme's own wide-screen handler
 * uses the same selector). Upstream: https://github.com/pydata/pydata-sphinx-theme/issues/2451
 * sphinx-book-theme 1.4.0 needs Sphinx 8.2, which jupyter-book 1.x cannot use.
 *
 * A click on a visible toggle that no theme handler took (the theme's handlers stop the event,
 * so one that reaches the document was not handled) is passed on to the button the theme bound,
 * which then does exactly what the theme does at that width: open the sidebar in a dialog, or
 * collapse it. When a theme release binds every toggle, this does nothing; remove it then.
 * tools/check_layout.py clicks the toggles at 400 and 1280 px on every page.
 */
(function () {
  "use strict";
  document.addEventListener("click", function (event) {
    var target = event.target instanceof Element ? event.target : null;
    var button = target && target.closest(".primary-toggle, .secondary-toggle");
    if (!button || event.defaultPrevented) return;
    var kind = button.classList.contains("primary-toggle") ? ".primary-toggle" : ".secondary-toggle";
    var bound = document.querySelector(kind);
    if (!bound || bound === button) return;
    event.preventDefault();
    bound.click();
  });
})();
