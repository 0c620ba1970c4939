// Sortable tables: click a header; the order is kept in the URL (#sort=TABLE:COLUMN:asc|desc)
// so a sorted view can be shared. Cells sort by data-value; empty values go last either way.
(function () {
  "use strict";
  function value(row, col) {
    var td = row.cells[col];
    if (!td) { return ""; }
    var v = td.getAttribute("data-value");
    return v === null ? td.textContent.trim() : v;
  }
  function sortTable(table, col, dir) {
    var head = table.tHead && table.tHead.rows[0];
    if (!head || col >= head.cells.length) { return; }
    var numeric = head.cells[col].getAttribute("data-type") === "num";
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var va = value(a, col), vb = value(b, col);
      if (va === "" || vb === "") { return va === vb ? 0 : (va === "" ? 1 : -1); }
      var c = numeric ? parseFloat(va) - parseFloat(vb) : va.localeCompare(vb);
      return dir === "desc" ? -c : c;
    });
    rows.forEach(function (r) { body.appendChild(r); });
    Array.prototype.forEach.call(head.cells, function (th, i) {
      th.setAttribute("aria-sort", i === col ? (dir === "asc" ? "ascending" : "descending") : "none");
    });
  }
  Array.prototype.forEach.call(document.querySelectorAll("table.sortable"), function (table) {
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th, i) {
      th.addEventListener("click", function () {
        var dir = th.getAttribute("aria-sort") === "ascending" ? "desc" : "asc";
        sortTable(table, i, dir);
        var hash = "#sort=" + encodeURIComponent(table.id) + ":" + i + ":" + dir;
        try { history.replaceState(null, "", hash); } catch (e) { location.hash = hash; }
      });
    });
  });
  var m = /^#sort=([^:]+):(\d+):(asc|desc)$/.exec(location.hash);
  if (m) {
    var t = document.getElementById(decodeURIComponent(m[1]));
    if (t) { sortTable(t, parseInt(m[2], 10), m[3]); }
  }
})();
