"""B3 trajectories: 7 templates -> 200 seeded tool-call sequences over the real data.

Unlike the public suite's (which never name a user and search for words no
product has, so they measure error paths), these find real users, search for
words that match, and write: orders placed, cancelled, returned, exchanged,
re-addressed. Every call of every trajectory is expected to succeed on a fresh
session; a tool error in a run means the runner broke something.
"""

from __future__ import annotations

import random
from typing import Any

from sandboxd.runners.tools.data import Database, build

Step = tuple[str, dict[str, Any]]
TEMPLATES = {  # name: weight (sums to 200 trajectories)
    "lookup_by_email": 30,
    "lookup_by_name_zip": 25,
    "browse_and_buy": 40,
    "cancel_pending": 30,
    "return_delivered": 30,
    "exchange_delivered": 25,
    "modify_address": 20,
}


class _Gen:
    def __init__(self, db: Database, rng: random.Random) -> None:
        self.db, self.rng = db, rng
        keys = [(u["name"]["first_name"], u["name"]["last_name"], u["address"]["zip"]) for u in db.users.values()]
        self.unique_name_zip = [
            u
            for u in db.users.values()
            if keys.count((u["name"]["first_name"], u["name"]["last_name"], u["address"]["zip"])) == 1
        ]

    def browse(self, n: int) -> list[Step]:
        steps: list[Step] = []
        for _ in range(n):
            p = self.rng.choice(list(self.db.products.values()))
            steps.append(("search_products", {"query": self.rng.choice(p["name"].split())}))
            steps.append(("get_product_details", {"product_id": p["product_id"]}))
        return steps

    def find(self, user: dict[str, Any], by_email: bool) -> Step:
        if by_email:
            return ("find_user_id_by_email", {"email": user["email"]})
        n = user["name"]
        return (
            "find_user_id_by_name_zip",
            {"first_name": n["first_name"], "last_name": n["last_name"], "zip": user["address"]["zip"]},
        )

    def user_with(self, pred: Any, unique_name: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
        users = self.unique_name_zip if unique_name else list(self.db.users.values())
        candidates = [(u, self.db.orders[o]) for u in users for o in u["orders"] if pred(self.db.orders[o])]
        return self.rng.choice(candidates)

    def lookup_by_email(self) -> list[Step]:
        user = self.rng.choice(list(self.db.users.values()))
        steps = [self.find(user, True), ("get_user_details", {"user_id": user["user_id"]})]
        for oid in user["orders"][:3]:
            order = self.db.orders[oid]
            steps += [
                ("get_order_details", {"order_id": oid}),
                ("get_product_details", {"product_id": order["items"][0]["product_id"]}),
            ]
        return steps + self.browse(3) + [("list_all_product_types", {})]

    def lookup_by_name_zip(self) -> list[Step]:
        user = self.rng.choice([u for u in self.unique_name_zip if u["orders"]])
        steps = [self.find(user, False), ("get_user_details", {"user_id": user["user_id"]})]
        for oid in user["orders"][:2]:
            steps.append(("get_order_details", {"order_id": oid}))
        return steps + self.browse(3) + [("view_cart", {"user_id": user["user_id"]})]

    def browse_and_buy(self) -> list[Step]:
        user = self.rng.choice(list(self.db.users.values()))
        uid = user["user_id"]
        steps = [self.find(user, True), *self.browse(3)]
        for p in self.rng.sample(list(self.db.products.values()), 2):
            available = [v["item_id"] for v in p["variants"].values() if v["available"]]
            steps += [
                ("get_product_details", {"product_id": p["product_id"]}),
                (
                    "add_to_cart",
                    {"user_id": uid, "item_id": self.rng.choice(available), "quantity": self.rng.randint(1, 2)},
                ),
            ]
        return [
            *steps,
            ("view_cart", {"user_id": uid}),
            ("place_order", {"user_id": uid, "payment_method_id": self.rng.choice(user["payment_methods"])}),
            ("get_user_details", {"user_id": uid}),
        ]

    def cancel_pending(self) -> list[Step]:
        user, order = self.user_with(lambda o: o["status"] == "pending")
        oid = order["order_id"]
        return [
            self.find(user, True),
            ("get_user_details", {"user_id": user["user_id"]}),
            *self.browse(2),
            ("get_order_details", {"order_id": oid}),
            ("get_product_details", {"product_id": order["items"][0]["product_id"]}),
            (
                "cancel_pending_order",
                {"order_id": oid, "reason": self.rng.choice(["no longer needed", "ordered by mistake"])},
            ),
            ("get_order_details", {"order_id": oid}),
        ]

    def return_delivered(self) -> list[Step]:
        user, order = self.user_with(lambda o: o["status"] == "delivered", unique_name=True)
        oid = order["order_id"]
        item = self.rng.choice(order["items"])
        return [
            self.find(user, False),
            ("get_user_details", {"user_id": user["user_id"]}),
            ("get_order_details", {"order_id": oid}),
            *self.browse(2),
            ("get_product_details", {"product_id": item["product_id"]}),
            (
                "return_delivered_order_items",
                {"order_id": oid, "item_ids": [item["item_id"]], "payment_method_id": user["payment_methods"][0]},
            ),
            ("get_order_details", {"order_id": oid}),
        ]

    def exchange_delivered(self) -> list[Step]:
        def exchangeable(o: dict[str, Any]) -> bool:
            return o["status"] == "delivered" and any(self._other_variant(x) for x in o["items"])

        user, order = self.user_with(exchangeable)
        oid = order["order_id"]
        item = next(x for x in order["items"] if self._other_variant(x))
        new = self.rng.choice(self._other_variant(item))
        return [
            self.find(user, True),
            ("get_user_details", {"user_id": user["user_id"]}),
            ("get_order_details", {"order_id": oid}),
            *self.browse(2),
            ("get_product_details", {"product_id": item["product_id"]}),
            (
                "exchange_delivered_order_items",
                {
                    "order_id": oid,
                    "item_ids": [item["item_id"]],
                    "new_item_ids": [new],
                    "payment_method_id": user["payment_methods"][-1],
                },
            ),
            ("get_order_details", {"order_id": oid}),
        ]

    def _other_variant(self, line: dict[str, Any]) -> list[str]:
        variants = self.db.products[line["product_id"]]["variants"].values()
        return [v["item_id"] for v in variants if v["available"] and v["item_id"] != line["item_id"]]

    def modify_address(self) -> list[Step]:
        user, order = self.user_with(lambda o: o["status"] == "pending")
        oid = order["order_id"]
        city = self.rng.choice(["Austin", "Denver", "Boston"])
        return [
            self.find(user, True),
            ("get_user_details", {"user_id": user["user_id"]}),
            *self.browse(3),
            ("get_order_details", {"order_id": oid}),
            (
                "modify_pending_order_address",
                {
                    "order_id": oid,
                    "address1": f"{self.rng.randint(1, 999)} Elm St",
                    "city": city,
                    "state": "TX",
                    "zip": "78702",
                },
            ),
            ("get_order_details", {"order_id": oid}),
        ]


def build_pool(seed: int = 42, db: Database | None = None) -> list[tuple[str, list[Step]]]:
    rng = random.Random(seed)
    gen = _Gen(db or build(), rng)
    pool = [(name, getattr(gen, name)()) for name, weight in TEMPLATES.items() for _ in range(weight)]
    rng.shuffle(pool)
    return pool
