"""Retail tools over a shared base database and a per-session overlay (copy-on-write).

A session sees the base database through its ``Overlay``: reads fall through to
the base, the first write to a record copies that one record into the overlay.
So every session starts from the same seeded data, its writes are its own, and
a reset is a new empty overlay (O(1), no file or database copy).

Tool failures (unknown user, order not cancellable, ...) raise ``ToolError``;
the runner returns them as observations: they are the agent's mistakes to
learn from, not HTTP errors.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from sandboxd.runners.tools.data import Database


class ToolError(Exception):
    pass


MAX_QUANTITY = 10  # of one item in one cart
MAX_LIST_ITEMS = 100  # in a list argument


@dataclass
class Overlay:
    base: Database
    users: dict[str, dict[str, Any]] = field(default_factory=dict)
    orders: dict[str, dict[str, Any]] = field(default_factory=dict)
    carts: dict[str, dict[str, int]] = field(default_factory=dict)
    next_order: int = 9000000
    writes: int = 0
    max_records: int = 200  # a session's own copies and new records at most: its memory is bounded
    max_string_chars: int = 512  # in any argument: what a session writes stays in its overlay

    def copy(self) -> Overlay:
        """A fork's overlay: its own copies of this session's records; the seeded base is shared, read-only."""
        return dataclasses.replace(
            self, users=copy.deepcopy(self.users), orders=copy.deepcopy(self.orders), carts=copy.deepcopy(self.carts)
        )

    def make_room(self) -> None:
        """Refuse a new record past ``max_records`` (the agent's error: a trajectory needs a few dozen)."""
        if len(self.users) + len(self.orders) + len(self.carts) >= self.max_records:
            raise ToolError(f"this session holds {self.max_records} records, its maximum; reset it to go on")

    def user(self, uid: str, write: bool = False) -> dict[str, Any]:
        return self._record(self.users, self.base.users, uid, write, "user")

    def order(self, oid: str, write: bool = False) -> dict[str, Any]:
        return self._record(self.orders, self.base.orders, oid, write, "order")

    def _record(
        self, mine: dict[str, dict[str, Any]], base: dict[str, dict[str, Any]], key: str, write: bool, what: str
    ) -> dict[str, Any]:
        """This session's copy if it wrote one, else the shared record; the first write copies it."""
        if key in mine:
            return mine[key]
        record = base.get(key)
        if record is None:
            raise ToolError(f"{what} not found: {key}")
        if not write:
            return record
        self.make_room()
        mine[key] = copy.deepcopy(record)
        return mine[key]

    def product(self, pid: str) -> dict[str, Any]:
        p = self.base.products.get(pid)
        if p is None:
            raise ToolError(f"product not found: {pid}")
        return p

    def variant(self, iid: str) -> tuple[dict[str, Any], dict[str, Any]]:
        pid = self.base.items.get(iid)
        if pid is None:
            raise ToolError(f"item not found: {iid}")
        product = self.base.products[pid]
        return product, product["variants"][iid]


def _payment(ov: Overlay, uid: str, method: str) -> None:
    if method not in ov.user(uid)["payment_methods"]:
        raise ToolError(f"payment method {method} does not belong to user {uid}")


def find_user_id_by_email(ov: Overlay, email: str) -> str:
    uid = ov.base.by_email.get(email.lower())
    if uid is None:
        raise ToolError(f"no user with email {email}")
    return uid


def find_user_id_by_name_zip(ov: Overlay, first_name: str, last_name: str, zip: str) -> str:
    for uid, u in ov.base.users.items():
        user = ov.users.get(uid, u)
        if (user["name"]["first_name"], user["name"]["last_name"], user["address"]["zip"]) == (
            first_name.lower(),
            last_name.lower(),
            zip,
        ):
            return uid
    raise ToolError(f"no user named {first_name} {last_name} at zip {zip}")


def get_user_details(ov: Overlay, user_id: str) -> dict[str, Any]:
    return ov.user(user_id)


def get_order_details(ov: Overlay, order_id: str) -> dict[str, Any]:
    return ov.order(order_id)


def get_product_details(ov: Overlay, product_id: str) -> dict[str, Any]:
    return ov.product(product_id)


def list_all_product_types(ov: Overlay) -> dict[str, str]:
    return {p["name"]: pid for pid, p in ov.base.products.items()}


def search_products(ov: Overlay, query: str, max_results: int = 10) -> list[dict[str, Any]]:
    words = query.lower().split()
    if not words:
        raise ToolError("query must not be empty")
    hits = []
    for p in ov.base.products.values():
        text = f"{p['name']} {p['category']}"
        if all(w in text for w in words):
            available = [v for v in p["variants"].values() if v["available"]]
            prices = [v["price"] for v in available]
            hits.append(
                {
                    "product_id": p["product_id"],
                    "name": p["name"],
                    "category": p["category"],
                    "available_variants": len(available),
                    "min_price": min(prices) if prices else None,
                }
            )
    return hits[: max(1, min(max_results, 50))]


def add_to_cart(ov: Overlay, user_id: str, item_id: str, quantity: int = 1) -> dict[str, Any]:
    ov.user(user_id)
    _, v = ov.variant(item_id)
    if not v["available"]:
        raise ToolError(f"item {item_id} is not available")
    if not 1 <= quantity <= MAX_QUANTITY:
        raise ToolError(f"quantity must be between 1 and {MAX_QUANTITY}")
    if user_id not in ov.carts:
        ov.make_room()
    cart = ov.carts.setdefault(user_id, {})
    if cart.get(item_id, 0) + quantity > MAX_QUANTITY:
        raise ToolError(f"a cart holds at most {MAX_QUANTITY} of an item")
    cart[item_id] = cart.get(item_id, 0) + quantity
    ov.writes += 1
    return view_cart(ov, user_id)


def view_cart(ov: Overlay, user_id: str) -> dict[str, Any]:
    ov.user(user_id)
    lines = []
    for iid, qty in ov.carts.get(user_id, {}).items():
        product, v = ov.variant(iid)
        lines.append(
            {"item_id": iid, "name": product["name"], "options": v["options"], "price": v["price"], "quantity": qty}
        )
    return {"user_id": user_id, "items": lines, "total": round(sum(x["price"] * x["quantity"] for x in lines), 2)}


def place_order(ov: Overlay, user_id: str, payment_method_id: str) -> dict[str, Any]:
    cart = ov.carts.get(user_id)
    if not cart:
        raise ToolError(f"the cart of {user_id} is empty")
    _payment(ov, user_id, payment_method_id)
    user = ov.user(user_id, write=True)
    ov.make_room()
    lines = []
    for iid, qty in cart.items():
        product, v = ov.variant(iid)
        lines += [
            {
                "item_id": iid,
                "product_id": product["product_id"],
                "name": product["name"],
                "price": v["price"],
                "options": v["options"],
            }
        ] * qty
    ov.next_order += 1
    oid = f"#W{ov.next_order}"
    ov.orders[oid] = {
        "order_id": oid,
        "user_id": user_id,
        "status": "pending",
        "items": lines,
        "address": dict(user["address"]),
        "payment_method_id": payment_method_id,
        "total": round(sum(x["price"] for x in lines), 2),
    }
    user["orders"].append(oid)
    ov.carts.pop(user_id, None)
    ov.writes += 1
    return ov.orders[oid]


def cancel_pending_order(ov: Overlay, order_id: str, reason: str) -> dict[str, Any]:
    if reason not in ("no longer needed", "ordered by mistake"):
        raise ToolError("reason must be 'no longer needed' or 'ordered by mistake'")
    order = ov.order(order_id)
    if order["status"] != "pending":
        raise ToolError(f"order {order_id} is {order['status']}: only pending orders can be cancelled")
    order = ov.order(order_id, write=True)
    order["status"] = "cancelled"
    order["cancel_reason"] = reason
    ov.writes += 1
    return order


def _delivered_items(ov: Overlay, order_id: str, item_ids: list[str]) -> dict[str, Any]:
    order = ov.order(order_id)
    if order["status"] != "delivered":
        raise ToolError(f"order {order_id} is {order['status']}: only delivered orders can be returned or exchanged")
    if not item_ids:
        raise ToolError("item_ids must not be empty")
    present = [x["item_id"] for x in order["items"]]
    for iid in item_ids:
        if item_ids.count(iid) > present.count(iid):
            raise ToolError(f"item {iid} is not in order {order_id} (or listed more often than bought)")
    return order


def return_delivered_order_items(
    ov: Overlay, order_id: str, item_ids: list[str], payment_method_id: str
) -> dict[str, Any]:
    order = _delivered_items(ov, order_id, item_ids)
    _payment(ov, order["user_id"], payment_method_id)
    order = ov.order(order_id, write=True)
    refund = round(sum(next(x["price"] for x in order["items"] if x["item_id"] == i) for i in item_ids), 2)
    order["status"] = "return requested"
    order["return"] = {"item_ids": item_ids, "refund_to": payment_method_id, "amount": refund}
    ov.writes += 1
    return order


def exchange_delivered_order_items(
    ov: Overlay, order_id: str, item_ids: list[str], new_item_ids: list[str], payment_method_id: str
) -> dict[str, Any]:
    order = _delivered_items(ov, order_id, item_ids)
    if len(item_ids) != len(new_item_ids):
        raise ToolError("item_ids and new_item_ids must have the same length")
    _payment(ov, order["user_id"], payment_method_id)
    diff = 0.0
    for old, new in zip(item_ids, new_item_ids, strict=True):
        old_product, old_v = ov.variant(old)
        new_product, new_v = ov.variant(new)
        if new_product is not old_product:
            raise ToolError(
                f"item {new} is a {new_product['name']}, not a {old_product['name']}: exchanges keep the product"
            )
        if not new_v["available"]:
            raise ToolError(f"item {new} is not available")
        diff += new_v["price"] - old_v["price"]
    order = ov.order(order_id, write=True)
    order["status"] = "exchange requested"
    order["exchange"] = {"item_ids": item_ids, "new_item_ids": new_item_ids, "price_difference": round(diff, 2)}
    ov.writes += 1
    return order


def modify_pending_order_address(
    ov: Overlay,
    order_id: str,
    address1: str,
    city: str,
    state: str,
    zip: str,
    address2: str = "",
    country: str = "USA",
) -> dict[str, Any]:
    order = ov.order(order_id)
    if order["status"] != "pending":
        raise ToolError(f"order {order_id} is {order['status']}: only pending orders can change address")
    order = ov.order(order_id, write=True)
    order["address"] = {
        "address1": address1,
        "address2": address2,
        "city": city,
        "state": state,
        "country": country,
        "zip": zip,
    }
    ov.writes += 1
    return order


def _s(desc: str, **kw: Any) -> dict[str, Any]:
    return {"description": desc, **kw}


STR, INT = {"type": "string"}, {"type": "integer"}
LIST = {"type": "array", "items": {"type": "string"}}
TOOLS: dict[str, tuple[Callable[..., Any], str, dict[str, dict[str, Any]], list[str]]] = {
    "find_user_id_by_email": (find_user_id_by_email, "Find a user id by email.", {"email": STR}, ["email"]),
    "find_user_id_by_name_zip": (
        find_user_id_by_name_zip,
        "Find a user id by first name, last name and zip code.",
        {"first_name": STR, "last_name": STR, "zip": STR},
        ["first_name", "last_name", "zip"],
    ),
    "get_user_details": (
        get_user_details,
        "Get a user's profile, addresses, payment methods and orders.",
        {"user_id": STR},
        ["user_id"],
    ),
    "get_order_details": (
        get_order_details,
        "Get an order's status, items, address and payment.",
        {"order_id": STR},
        ["order_id"],
    ),
    "get_product_details": (
        get_product_details,
        "Get a product and all its variants (item ids, options, price, availability).",
        {"product_id": STR},
        ["product_id"],
    ),
    "list_all_product_types": (list_all_product_types, "List product names and their product ids.", {}, []),
    "search_products": (
        search_products,
        "Search products by words of their name or category.",
        {"query": STR, "max_results": INT},
        ["query"],
    ),
    "add_to_cart": (
        add_to_cart,
        "Add an available item (variant) to a user's cart.",
        {"user_id": STR, "item_id": STR, "quantity": INT},
        ["user_id", "item_id"],
    ),
    "view_cart": (view_cart, "Show a user's cart and its total.", {"user_id": STR}, ["user_id"]),
    "place_order": (
        place_order,
        "Turn the user's cart into a pending order paid with one of their payment methods.",
        {"user_id": STR, "payment_method_id": STR},
        ["user_id", "payment_method_id"],
    ),
    "cancel_pending_order": (
        cancel_pending_order,
        "Cancel a pending order. reason: 'no longer needed' or 'ordered by mistake'.",
        {"order_id": STR, "reason": {"type": "string", "enum": ["no longer needed", "ordered by mistake"]}},
        ["order_id", "reason"],
    ),
    "return_delivered_order_items": (
        return_delivered_order_items,
        "Return items of a delivered order; the refund goes to the given payment method.",
        {"order_id": STR, "item_ids": LIST, "payment_method_id": STR},
        ["order_id", "item_ids", "payment_method_id"],
    ),
    "exchange_delivered_order_items": (
        exchange_delivered_order_items,
        "Exchange items of a delivered order for other available variants of the same products.",
        {"order_id": STR, "item_ids": LIST, "new_item_ids": LIST, "payment_method_id": STR},
        ["order_id", "item_ids", "new_item_ids", "payment_method_id"],
    ),
    "modify_pending_order_address": (
        modify_pending_order_address,
        "Change the shipping address of a pending order.",
        {"order_id": STR, "address1": STR, "address2": STR, "city": STR, "state": STR, "country": STR, "zip": STR},
        ["order_id", "address1", "city", "state", "zip"],
    ),
}


def openai_tools() -> list[dict[str, Any]]:
    """The tool listing in the OpenAI function-calling shape, ready to hand to a model."""
    return [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": desc,
                "parameters": {
                    "type": "object",
                    "properties": props,
                    "required": required,
                    "additionalProperties": False,
                },
            },
        }
        for name, (_, desc, props, required) in TOOLS.items()
    ]


_TYPES = {"string": str, "integer": int, "array": list}


def call(ov: Overlay, tool: str, args: dict[str, Any]) -> Any:
    """Validate ``args`` against the tool's schema and run it (ToolError on any mistake).

    Strings (``ov.max_string_chars``) and lists are capped: what a session
    writes stays in its overlay for its lifetime, so an argument's size is a
    session's memory.
    """
    if tool not in TOOLS:
        raise ToolError(f"unknown tool {tool!r}; tools: {', '.join(TOOLS)}")
    fn, _, props, required = TOOLS[tool]
    missing = [k for k in required if k not in args]
    if missing:
        raise ToolError(f"{tool}: missing arguments {missing}")
    extra = [k for k in args if k not in props]
    if extra:
        raise ToolError(f"{tool}: unknown arguments {extra}")
    for k, v in args.items():
        want = _TYPES[props[k]["type"]]
        if not isinstance(v, want) or isinstance(v, bool):
            raise ToolError(f"{tool}: argument {k} must be a {props[k]['type']}")
        if isinstance(v, list) and not all(isinstance(x, str) for x in v):
            raise ToolError(f"{tool}: argument {k} must be a list of strings")
        if isinstance(v, list) and len(v) > MAX_LIST_ITEMS:
            raise ToolError(f"{tool}: argument {k} has {len(v)} items (at most {MAX_LIST_ITEMS})")
        for text in v if isinstance(v, list) else [v]:
            if isinstance(text, str) and len(text) > ov.max_string_chars:
                raise ToolError(f"{tool}: argument {k} is {len(text)} characters long (at most {ov.max_string_chars})")
    # A copy, not the records themselves (nothing later may alias the store): orjson's round trip is ~8x
    # cheaper than copy.deepcopy, and a result is JSON by contract.
    return orjson.loads(orjson.dumps(fn(ov, **args)))
