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

/* The drawer closes after a tap on one of its links. Below 992 px the theme shows the chapter
 * list and the page's contents in a modal <dialog> that only a tap on its backdrop or Escape
 * closes: a reader who taps a section of this page (or the page itself) lands there with the
 * drawer still covering it, and one who taps another chapter sees the drawer until that page
 * loads (and again on coming back, when the browser restores the page as it was left).
 * Closing the dialog also puts the sidebar's nodes back where the theme keeps them, so the
 * link's own navigation goes on as usual. tools/check_layout.py taps a link in each drawer.
 */
(function () {
  "use strict";
  var DRAWERS = "#pst-primary-sidebar-modal, #pst-secondary-sidebar-modal";
  document.addEventListener("click", function (event) {
    if (event.button !== 0 || event.ctrlKey || event.metaKey || event.shiftKey || event.altKey) {
      return;  // a link opened in another tab or window: this page's drawer stays as it was
    }
    var target = event.target instanceof Element ? event.target : null;
    var link = target && target.closest("a[href]");
    var drawer = link && link.closest(DRAWERS);
    if (!drawer || !drawer.open) return;
    // The theme hands focus back to the toggle when the drawer closes, which shows the
    // toggle's tooltip over the page the reader asked for; a link was taken, not dismissed.
    drawer.addEventListener("close", function () {
      var focused = document.activeElement;
      if (focused && focused.closest && focused.closest(".sidebar-toggle")) focused.blur();
    }, {once: true});
    drawer.close();
  });
  window.addEventListener("pageshow", function (event) {
    if (!event.persisted) return;
    document.querySelectorAll(DRAWERS).forEach(function (drawer) {
      if (drawer.open) drawer.close();
    });
  });
})();
