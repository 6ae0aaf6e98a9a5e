"""The public suite's B3 trajectories (7 templates -> 200, seed 42) as HTTP calls to its mock API.

Only for the comparison with the suite's worker (``b3_vs_baseline``): these are the suite's own calls
(placeholders drawn fresh for every step, every call as the default user "alice"), not sandboxd's B3
trajectories, which find real users and write real orders through a tools session.
"""

from __future__ import annotations

import random
from typing import Any

Call = tuple[str, str, dict[str, Any] | None]  # method, path with query, JSON body
QUERIES = (
    "headphones laptop phone camera tablet watch speaker monitor keyboard mouse "
    "router ssd ram gpu psu cable charger case stand hub"
).split()
REASONS = (
    "defective",
    "wrong item",
    "damaged in shipping",
    "no longer needed",
    "found cheaper elsewhere",
    "duplicate order",
)
NAMES = ("alice", "bob", "carol", "dave", "eve", "frank")
TEMPLATES: dict[str, tuple[int, str]] = {  # name: (weight, sequence)
    "browse_only": (20, "S P S P R5 P I F"),
    "buy_simple": (25, "S P A1 C P A2 C X L F"),
    "buy_with_compare": (15, "S P P P R5 P A1 C A1 C X L F I"),
    "refund_flow": (10, "F L S P A1 X L Rf L F R3 S"),
    "inventory_heavy": (10, "S I I P I S I P I R10 I P I H F I I I"),
    "checkout_loop": (10, "S A1 X L A2 X L A1 X L A3 X L F R5 S"),
    "profile_admin": (10, "F U F U F U F R5 F"),
}


def _call(token: str, rng: random.Random) -> Call:
    sku = rng.randrange(200)
    if token == "S":
        return ("GET", f"/search?q={rng.choice(QUERIES)}", None)
    if token == "P":
        return ("GET", f"/product/{sku}", None)
    if token.startswith("A"):
        return ("POST", "/cart/add", {"sku": f"SKU-{sku}", "qty": int(token[1:])})
    if token == "C":
        return ("GET", "/cart", None)
    if token == "X":
        return ("POST", "/checkout", {"payment": "card"})
    if token == "L":
        return ("GET", "/order/last", None)
    if token == "F":
        return ("GET", "/profile", None)
    if token == "Rf":
        return ("POST", "/order/refund", {"reason": rng.choice(REASONS)})
    if token.startswith("R"):
        return ("GET", f"/recommend?k={int(token[1:])}", None)
    if token == "I":
        return ("GET", f"/inventory?sku=SKU-{sku}", None)
    if token == "H":
        return ("GET", "/healthz", None)
    if token == "U":
        return ("POST", "/profile/update", {"name": rng.choice(NAMES)})
    raise ValueError(token)


def build_pool(seed: int = 42, size: int = 200) -> list[tuple[str, list[Call]]]:
    """``max(1, round(size * w / sum))`` trajectories per template, in table order with one RNG, shuffled."""
    rng = random.Random(seed)
    total = sum(w for w, _ in TEMPLATES.values())
    pool = [
        (name, [_call(t, rng) for t in seq.split()])
        for name, (w, seq) in TEMPLATES.items()
        for _ in range(max(1, round(size * w / total)))
    ]
    rng.shuffle(pool)
    return pool
