// Bench Shop: one script for the seven pages (selectors as in the public suite's B4 site).
(function () {
  var CART_KEY = "bench-shop-cart-v1";
  var items = window.SHOP.items;
  function $(sel) { return document.querySelector(sel); }
  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    for (var k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function cart() {
    try { return JSON.parse(localStorage.getItem(CART_KEY) || "{}"); } catch (e) { return {}; }
  }
  function saveCart(c) { localStorage.setItem(CART_KEY, JSON.stringify(c)); }
  function byId(id) { return items.filter(function (x) { return x.id === Number(id); })[0]; }
  function param(name) { return new URLSearchParams(location.search).get(name); }
  function money(x) { return "$" + x.toFixed(2); }

  function nav() {
    var n = el("nav", { id: "nav" });
    [["/", "Home"], ["/cart.html", "Cart"], ["/orders.html", "Orders"], ["/profile.html", "Profile"]].forEach(function (l) {
      n.appendChild(el("a", { href: l[0] }, l[1]));
    });
    document.body.insertBefore(n, document.body.firstChild);
  }

  function card(it) {
    var c = el("div", { "class": "product", "data-id": String(it.id) });
    var a = el("a", { "class": "product-link", "data-id": String(it.id), href: "/product.html?id=" + it.id }, it.name);
    c.appendChild(a);
    c.appendChild(el("div", { "class": "price" }, money(it.price)));
    c.appendChild(el("div", { "class": "rating" }, "★ " + it.rating));
    var b = el("button", { "class": "add-to-cart", "data-id": String(it.id), "data-sku": it.sku }, "Add to cart");
    b.addEventListener("click", function () {
      var c2 = cart();
      c2[it.id] = (c2[it.id] || 0) + 1;
      saveCart(c2);
      b.textContent = "Added";
    });
    c.appendChild(b);
    return c;
  }

  function grid(list, pageSize, target) {
    var shown = 0;
    var g = $("#grid");
    function more() {
      list.slice(shown, shown + pageSize).forEach(function (it) { g.appendChild(card(it)); });
      shown = Math.min(list.length, shown + pageSize);
      $("#page-info").textContent = shown + " / " + list.length;
      $("#load-more").disabled = shown >= list.length;
    }
    function render(sorted) {
      list = sorted;
      g.innerHTML = "";
      shown = 0;
      more();
    }
    $("#load-more").addEventListener("click", more);
    $(".sort-price").addEventListener("click", function () { render(list.slice().sort(function (a, b) { return a.price - b.price; })); });
    $(".sort-rating").addEventListener("click", function () { render(list.slice().sort(function (a, b) { return b.rating - a.rating; })); });
    $(".sort-name").addEventListener("click", function () { render(list.slice().sort(function (a, b) { return a.name < b.name ? -1 : 1; })); });
    render(list);
  }

  function searchBox() {
    var go = function () { location.href = "/search.html?q=" + encodeURIComponent($("#search-box").value); };
    $("#search-btn").addEventListener("click", go);
    $("#search-box").addEventListener("keydown", function (e) { if (e.key === "Enter") go(); });
  }

  var pages = {
    index: function () { searchBox(); grid(items, 24); },
    search: function () {
      searchBox();
      var q = (param("q") || "").toLowerCase();
      $("#search-box").value = param("q") || "";
      var hits = items.filter(function (it) {
        return (it.name + " " + it.category + " " + it.description).toLowerCase().indexOf(q) >= 0;
      });
      document.title = 'Results for "' + (param("q") || "") + '"';
      $("h1").textContent = document.title;
      grid(hits, 12);
    },
    product: function () {
      var it = byId(param("id")) || items[0];
      document.title = it.name;
      var d = $("#detail");
      d.appendChild(el("h1", {}, it.name));
      d.appendChild(el("div", { "class": "price" }, money(it.price)));
      d.appendChild(el("div", { "class": "rating" }, "★ " + it.rating));
      d.appendChild(el("p", { "class": "description" }, it.description));
      var b = card(it).querySelector(".add-to-cart");
      d.appendChild(b);
      var r = $("#reviews");
      for (var k = 1; k <= 8; k++) r.appendChild(el("li", { "class": "review" }, "Review " + k + ": solid " + it.category + " pick, " + ((k % 5) + 1) + "/5"));
      var g = $("#grid");
      items.filter(function (x) { return x.id !== it.id; }).slice(0, 6).forEach(function (x) { g.appendChild(card(x)); });
    },
    cart: function () {
      function render() {
        var c = cart(), body = $("#cart-rows"), total = 0;
        body.innerHTML = "";
        Object.keys(c).forEach(function (id) {
          var it = byId(id);
          if (!it || c[id] <= 0) return;
          var tr = el("tr", { "class": "cart-row", "data-id": id });
          tr.appendChild(el("td", {}, it.name));
          var q = el("td");
          var dec = el("button", { "class": "qty-dec", "data-id": id }, "−");
          var inc = el("button", { "class": "qty-inc", "data-id": id }, "+");
          dec.addEventListener("click", function () { var c2 = cart(); c2[id] = Math.max(0, (c2[id] || 0) - 1); if (!c2[id]) delete c2[id]; saveCart(c2); render(); });
          inc.addEventListener("click", function () { var c2 = cart(); c2[id] = (c2[id] || 0) + 1; saveCart(c2); render(); });
          q.appendChild(dec); q.appendChild(el("span", { "class": "qty" }, String(c[id]))); q.appendChild(inc);
          tr.appendChild(q);
          tr.appendChild(el("td", {}, money(it.price)));
          tr.appendChild(el("td", { "class": "subtotal" }, money(it.price * c[id])));
          total += it.price * c[id];
          body.appendChild(tr);
        });
        $("#total").textContent = money(total);
      }
      render();
    },
    checkout: function () {
      $("#place-order").addEventListener("click", function () {
        var ok = ["#name", "#email", "#address"].every(function (s) { return $(s).value.trim() !== ""; });
        if (!ok) { $("#status").textContent = "Please fill in name, email and address."; return; }
        saveCart({});
        $("#status").textContent = "Order placed. Thank you!";
        setTimeout(function () { location.href = "/orders.html"; }, 50);
      });
    },
    orders: function () {
      function render(tab) {
        var body = $("#order-rows");
        body.innerHTML = "";
        window.SHOP.orders.filter(function (o) { return tab === "all" || o.status === tab; }).forEach(function (o) {
          var tr = el("tr", { "class": "order-row" });
          [o.id, o.date, o.items, money(o.total), o.status].forEach(function (v) { tr.appendChild(el("td", {}, String(v))); });
          body.appendChild(tr);
        });
      }
      Array.prototype.forEach.call(document.querySelectorAll("button.tab-orders"), function (b) {
        b.addEventListener("click", function () { render(b.getAttribute("data-tab")); });
      });
      render("all");
    },
    profile: function () {
      $("#save-profile").addEventListener("click", function () {
        localStorage.setItem("bench-shop-profile-v1", JSON.stringify({ username: $("#username").value, email: $("#email").value, tier: $("#tier").value }));
        $("#status").textContent = "Profile saved.";
      });
      var g = $("#grid");
      items.slice(0, 8).forEach(function (x) { g.appendChild(card(x)); });
    }
  };

  document.addEventListener("DOMContentLoaded", function () {
    nav();
    var page = document.body.getAttribute("data-page");
    if (pages[page]) pages[page]();
  });
})();
