"""The seeded retail database every tools session starts from (tau-bench-like).

Built once per worker from a fixed seed, then never written: sessions write
into their own overlay (``store.Overlay``), so resetting a session is dropping
a dict, not copying a database.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

SEED = 20240601
FIRST = "ava ben chloe dan emma finn grace hugo isla jack kai lena mia noah olivia paul quinn ruby sam tara".split()
LAST = "smith jones brown taylor wilson davies evans thomas johnson roberts walker wright".split()
CITIES = [
    ("Austin", "TX", "78701"), ("Denver", "CO", "80202"), ("Seattle", "WA", "98101"), ("Boston", "MA", "02108"),
    ("Portland", "OR", "97201"), ("Chicago", "IL", "60601"), ("Miami", "FL", "33101"), ("Phoenix", "AZ", "85001"),
]  # fmt: skip
PRODUCTS = {
    "headphones": ("electronics", {"color": ["black", "white", "blue"], "connectivity": ["wired", "wireless"]}),
    "laptop": ("electronics", {"screen": ["13-inch", "15-inch"], "storage": ["256GB", "512GB", "1TB"]}),
    "water bottle": ("outdoor", {"capacity": ["500ml", "750ml", "1000ml"], "color": ["green", "black", "red"]}),
    "t-shirt": ("clothing", {"size": ["S", "M", "L", "XL"], "color": ["white", "black", "navy"]}),
    "running shoes": ("clothing", {"size": ["8", "9", "10", "11"], "color": ["grey", "black"]}),
    "backpack": ("outdoor", {"size": ["small", "medium", "large"], "color": ["black", "olive"]}),
    "desk lamp": ("home", {"color": ["white", "black"], "power": ["battery", "usb", "ac"]}),
    "coffee maker": ("home", {"capacity": ["4 cups", "8 cups", "12 cups"]}),
    "mechanical keyboard": ("electronics", {"switch": ["linear", "tactile", "clicky"], "layout": ["full", "tkl"]}),
    "yoga mat": ("outdoor", {"thickness": ["4mm", "6mm"], "color": ["purple", "blue", "black"]}),
    "smart watch": ("electronics", {"color": ["black", "silver"], "band": ["leather", "sport"]}),
    "office chair": ("home", {"material": ["mesh", "leather"], "color": ["black", "grey"]}),
}
STATUSES = ["pending", "pending", "processed", "delivered", "delivered", "delivered", "cancelled"]


@dataclass
class Database:
    users: dict[str, dict[str, Any]] = field(default_factory=dict)
    products: dict[str, dict[str, Any]] = field(default_factory=dict)
    items: dict[str, str] = field(default_factory=dict)  # item_id -> product_id
    orders: dict[str, dict[str, Any]] = field(default_factory=dict)
    by_email: dict[str, str] = field(default_factory=dict)


def build(seed: int = SEED, n_users: int = 120, n_orders: int = 360) -> Database:
    rng = random.Random(seed)
    db = Database()
    item_no = 100000
    for k, (name, (category, options)) in enumerate(PRODUCTS.items()):
        pid = f"P{1000 + k}"
        variants = {}
        combos: list[dict[str, str]] = [{}]
        for opt, values in options.items():
            combos = [dict(c, **{opt: v}) for c in combos for v in values]
        for combo in combos:
            item_no += rng.randint(1, 97)
            iid = str(item_no)
            variants[iid] = {
                "item_id": iid,
                "options": combo,
                "price": round(rng.uniform(9, 900), 2),
                "available": rng.random() > 0.2,
            }
            db.items[iid] = pid
        db.products[pid] = {"product_id": pid, "name": name, "category": category, "variants": variants}
    for n in range(n_users):
        first, last = rng.choice(FIRST), rng.choice(LAST)
        city, state, zipc = rng.choice(CITIES)
        uid = f"{first}_{last}_{1000 + n}"
        email = f"{first}.{last}{n}@example.com"
        cards = [f"credit_card_{rng.randint(1000000, 9999999)}"]
        if rng.random() < 0.5:
            cards.append(f"gift_card_{rng.randint(1000000, 9999999)}")
        db.users[uid] = {
            "user_id": uid,
            "name": {"first_name": first, "last_name": last},
            "email": email,
            "address": {
                "address1": f"{rng.randint(1, 999)} Main St",
                "address2": "",
                "city": city,
                "state": state,
                "country": "USA",
                "zip": zipc,
            },
            "payment_methods": cards,
            "orders": [],
        }
        db.by_email[email] = uid
    users = list(db.users)
    for n in range(n_orders):
        uid = rng.choice(users)
        user = db.users[uid]
        lines = []
        for _ in range(rng.randint(1, 4)):
            pid = rng.choice(list(db.products))
            iid = rng.choice(list(db.products[pid]["variants"]))
            v = db.products[pid]["variants"][iid]
            lines.append(
                {
                    "item_id": iid,
                    "product_id": pid,
                    "name": db.products[pid]["name"],
                    "price": v["price"],
                    "options": v["options"],
                }
            )
        oid = f"#W{1000000 + n}"
        db.orders[oid] = {
            "order_id": oid,
            "user_id": uid,
            "status": rng.choice(STATUSES),
            "items": lines,
            "address": dict(user["address"]),
            "payment_method_id": user["payment_methods"][0],
            "total": round(sum(x["price"] for x in lines), 2),
        }
        user["orders"].append(oid)
    return db
