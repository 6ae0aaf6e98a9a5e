"""B4 trajectories: the public suite's 8 templates -> 80 seeded trajectories of browser actions.

Same templates, weights, placeholders and selector-miss semantics as the
suite (a fresh draw for every placeholder of every argument, so ``$PID1`` in
two steps usually names two products; the index renders ids 1-24 only, so
PID-specific clicks there miss by design and burn their 500 ms). Actions use
the suite's names (``type`` is a fill).
"""

from __future__ import annotations

import random
from typing import Any

Action = dict[str, Any]
TEMPLATES: dict[str, int] = {  # name: weight
    "browse_only": 25,
    "search_filter": 20,
    "add_to_cart": 15,
    "checkout_flow": 10,
    "product_compare": 10,
    "paginate_scroll": 8,
    "screenshot_heavy": 6,
    "profile_update": 6,
}
QUERIES = ["phone", "laptop", "headphones", "camera", "watch", "tablet", "speaker", "monitor", "mouse", "keyboard"]
NAMES = ["alice", "bob", "carol", "dave", "eve"]
EMAILS = ["a@b.io", "c@d.io", "e@f.io"]
ADDRS = ["1 Main St", "42 Oak Ave", "7 Pine Rd"]

# G = goto, Cl = click, T = type, Sc = scroll, Ss = screenshot (the suite's notation)
SPECS: dict[str, list[tuple[str, ...]]] = {
    "browse_only": [
        ("G", "/"), ("Cl", "a.product-link[data-id='$PID']"), ("Sc", "400"), ("Ss",), ("G", "/"),
        ("Cl", "a.product-link[data-id='$PID']"), ("Sc", "600"), ("Ss",), ("G", "/"), ("Sc", "300"),
    ],
    "search_filter": [
        ("G", "/"), ("T", "input#search-box", "$Q"), ("Cl", "button#search-btn"), ("G", "/search.html?q=$Q"),
        ("Cl", "button.sort-price"), ("Sc", "400"), ("Cl", "a.product-link"), ("Sc", "200"), ("Ss",),
        ("G", "/search.html?q=$Q"), ("Cl", "button.sort-rating"), ("Ss",),
    ],
    "add_to_cart": [
        ("G", "/"), ("Cl", "button.add-to-cart[data-id='$PID']"), ("Cl", "button.add-to-cart[data-id='$PID']"),
        ("Cl", "button.add-to-cart[data-id='$PID']"), ("G", "/cart.html"), ("Cl", "button.qty-inc[data-id='$PID']"),
        ("Cl", "button.qty-inc[data-id='$PID']"), ("Cl", "button.qty-dec[data-id='$PID']"), ("Sc", "200"), ("Ss",),
    ],
    "checkout_flow": [
        ("G", "/"), ("Cl", "button.add-to-cart[data-id='$PID']"), ("Cl", "button.add-to-cart[data-id='$PID']"),
        ("G", "/cart.html"), ("Cl", "a#checkout-link"), ("T", "input#name", "$NAME"), ("T", "input#email", "$EMAIL"),
        ("T", "input#address", "$ADDR"), ("Cl", "input#payment-card"), ("Cl", "button#place-order"),
        ("G", "/orders.html"), ("Sc", "300"), ("Ss",), ("G", "/profile.html"),
    ],
    "product_compare": [
        ("G", "/product.html?id=$PID"), ("Sc", "300"), ("Ss",), ("G", "/product.html?id=$PID"), ("Sc", "300"),
        ("Ss",), ("G", "/product.html?id=$PID"), ("Sc", "400"), ("Cl", "button.add-to-cart"),
        ("G", "/product.html?id=$PID"), ("Sc", "200"), ("Ss",),
    ],
    "paginate_scroll": [
        ("G", "/"), ("Sc", "600"), ("Sc", "600"), ("Cl", "button#load-more"), ("Sc", "600"), ("Sc", "600"),
        ("Cl", "button#load-more"), ("Sc", "400"), ("Cl", "a.product-link"), ("Sc", "300"), ("Sc", "300"), ("Ss",),
        ("G", "/"), ("Sc", "800"), ("Ss",),
    ],
    "screenshot_heavy": [
        ("G", "/"), ("Ss",), ("Sc", "400"), ("Ss",), ("Sc", "400"), ("Ss",), ("Sc", "400"), ("Ss",),
        ("G", "/product.html?id=$PID"), ("Ss",),
    ],
    "profile_update": [
        ("G", "/profile.html"), ("T", "input#username", "$NAME"), ("T", "input#email", "$EMAIL"),
        ("Cl", "button#save-profile"), ("Ss",), ("G", "/orders.html"), ("Sc", "200"), ("Cl", "button.tab-orders"),
        ("Ss",), ("G", "/profile.html"),
    ],
}  # fmt: skip


CHOICES: dict[str, list[str]] = {
    "$PID": [str(i) for i in range(1, 61)],
    "$Q": QUERIES,
    "$NAME": NAMES,
    "$EMAIL": EMAILS,
    "$ADDR": ADDRS,
}


def _fill(text: str, rng: random.Random) -> str:
    for key, options in CHOICES.items():
        while key in text:
            text = text.replace(key, rng.choice(options), 1)
    return text


def _action(spec: tuple[str, ...], rng: random.Random) -> Action:
    kind, *args = spec
    if kind == "G":
        return {"action": "goto", "path": _fill(args[0], rng)}
    if kind == "Cl":
        return {"action": "click", "selector": _fill(args[0], rng)}
    if kind == "T":
        return {"action": "type", "selector": args[0], "text": _fill(args[1], rng)}
    if kind == "Sc":
        return {"action": "scroll", "y": int(args[0])}
    return {"action": "screenshot"}


def build_pool(seed: int, size: int = 80) -> list[tuple[str, list[Action]]]:
    """``size`` trajectories split by weight (max(1, round(size * w / 100)) each), in template order."""
    rng = random.Random(seed)
    pool: list[tuple[str, list[Action]]] = []
    for name, weight in TEMPLATES.items():
        for _ in range(max(1, round(size * weight / 100))):
            pool.append((name, [_action(spec, rng) for spec in SPECS[name]]))
    return pool
