// Bench Shop catalogue and orders, generated exactly as the public suite's B4 site does.
(function () {
  var NOUNS = ["phone", "laptop", "headphones", "camera", "watch", "tablet", "speaker", "monitor", "mouse", "keyboard"];
  var ADJS = ["pro", "ultra", "lite", "max", "core", "edge", "studio", "go"];
  var CATS = ["audio", "computing", "wearables", "imaging", "accessory"];
  function round2(x) { return Math.round(x * 100) / 100; }
  function round1(x) { return Math.round(x * 10) / 10; }
  var items = [];
  for (var i = 1; i <= 60; i++) {
    var noun = NOUNS[i % 10], adj = ADJS[i % 8], cat = CATS[i % 5];
    items.push({
      id: i,
      sku: "SKU-" + (10000 + i),
      name: noun + " " + adj + " " + i,
      price: round2(9.99 + ((i * 7.31) % 480)),
      rating: round1(((i * 13) % 50) / 10),
      category: cat,
      description: "A " + adj + " " + noun + " for everyday " + cat + ". Built to last, priced to move."
    });
  }
  var orders = [];
  for (var k = 1; k <= 25; k++) {
    var mm = (k % 12) + 1, dd = ((3 * k) % 27) + 1;
    orders.push({
      id: 1000 + k,
      date: "2026-" + (mm < 10 ? "0" : "") + mm + "-" + (dd < 10 ? "0" : "") + dd,
      items: ((7 * k) % 5) + 1,
      total: round2(20 + ((11.7 * k) % 240)),
      status: k % 6 === 0 ? "refunded" : "paid"
    });
  }
  window.SHOP = { items: items, orders: orders };
})();
