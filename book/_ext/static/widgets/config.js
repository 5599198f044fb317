// Loaded between require.js and the widget manager (embed-amd.js) on pages that show widgets; see _config.yml.
// Everything is served from this site (_static/widgets/, beside this file):
// - anywidget's front-end module;
// - the manager's own fonts: it looks for them beside the URL require.js gives its module, so map that here;
// - any other widget module the manager would fetch from a CDN: a local miss (a 404 the tests see), never a CDN.
(function () {
  var here = document.currentScript.src.replace(/\/[^/]*$/, ""); // <site>/_static/widgets
  window.requirejs.config({
    paths: { anywidget: here + "/anywidget", "@jupyter-widgets/html-manager/dist": here },
  });
  document.currentScript.setAttribute("data-jupyter-widgets-cdn", here + "/modules/");
})();
