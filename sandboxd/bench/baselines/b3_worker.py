"""A replica of the public suite's B3 mock retail API, as the suite describes it (the baseline of
``b3_vs_baseline``).

FastAPI with sync handlers (run in its threadpool), served by ``uvicorn --workers W`` (W = vCPUs), state
in each process's memory: a read-only catalogue of 200 SKUs and users created on first access, each with a
lock, a cart and orders. No isolation between callers: every trajectory of every client shares one
process's users (what sandboxd's per-session copy-on-write overlay exists to prevent).

    python -m sandboxd.bench.baselines.b3_worker --port 8003 --workers 2
"""

from __future__ import annotations

import argparse
import os
import threading
from typing import Any

import uvicorn
from fastapi import Body, FastAPI, HTTPException

NUM_SKUS = int(os.environ.get("B3_NUM_SKUS", "200"))
ITEMS: list[dict[str, Any]] = [
    {"sku": f"SKU-{i}", "name": f"item-{i}", "price": 10.0 + i, "qty": 100} for i in range(NUM_SKUS)
]
BY_SKU = {it["sku"]: it for it in ITEMS}

app = FastAPI()
_users: dict[str, dict[str, Any]] = {}
_users_lock = threading.Lock()


def _user(name: str) -> dict[str, Any]:
    u = _users.get(name)
    if u is None:
        with _users_lock:
            u = _users.get(name)
            if u is None:
                u = _users[name] = {"lock": threading.Lock(), "cart": {}, "orders": [], "next_order_id": 1}
    return u


@app.get("/healthz")
def healthz() -> dict[str, Any]:
    return {"ok": True, "skus": len(ITEMS), "users": len(_users)}


@app.get("/search")
def search(q: str = "") -> dict[str, Any]:
    q = q.lower()
    hits = [it for it in ITEMS if q in it["name"]][:10] if q else ITEMS[:10]
    return {"results": [{"sku": it["sku"], "name": it["name"], "price": it["price"]} for it in hits]}


@app.get("/product/{sku_id}")
def product(sku_id: int) -> dict[str, Any]:
    it = BY_SKU.get(f"SKU-{sku_id}")
    if it is None:
        raise HTTPException(404, "no such product")
    return dict(it)


@app.post("/cart/add")
def cart_add(body: dict[str, Any] = Body(...)) -> dict[str, Any]:  # noqa: B008  (FastAPI's idiom)
    u = _user(str(body.get("user", "alice")))
    sku, qty = str(body.get("sku", "SKU-0")), int(body.get("qty", 1))
    with u["lock"]:
        u["cart"][sku] = u["cart"].get(sku, 0) + qty
    return {"ok": True}


@app.get("/cart")
def cart(user: str = "alice") -> dict[str, Any]:
    u = _user(user)
    with u["lock"]:
        return {"items": [{"sku": s, "qty": q} for s, q in u["cart"].items()]}


@app.post("/checkout")
def checkout(body: dict[str, Any] = Body(...)) -> dict[str, Any]:  # noqa: B008
    u = _user(str(body.get("user", "alice")))
    with u["lock"]:
        total = sum(BY_SKU[s]["price"] * q for s, q in u["cart"].items() if s in BY_SKU)
        oid = u["next_order_id"]
        u["next_order_id"] += 1
        u["orders"].append({"id": oid, "total": total, "status": "paid"})
        u["cart"].clear()
    return {"order_id": oid, "total": total}


@app.get("/order/last")
def order_last(user: str = "alice") -> dict[str, Any]:
    u = _user(user)
    with u["lock"]:
        return dict(u["orders"][-1]) if u["orders"] else {"id": None, "total": 0, "status": "none"}


@app.post("/order/refund")
def refund(body: dict[str, Any] = Body(...)) -> dict[str, Any]:  # noqa: B008
    u = _user(str(body.get("user", "alice")))
    with u["lock"]:
        if u["orders"]:
            u["orders"][-1]["status"] = "refunded"
    return {"ok": True, "reason": body.get("reason")}


@app.get("/profile")
def profile(user: str = "alice") -> dict[str, Any]:
    return {"user": user, "tier": "gold", "points": 1234}


@app.post("/profile/update")
def profile_update(body: dict[str, Any] = Body(...)) -> dict[str, Any]:  # noqa: B008
    return {"ok": True, "name": body.get("name")}


@app.get("/recommend")
def recommend(k: int = 5) -> dict[str, Any]:
    k = max(1, min(k, 20))
    return {"items": [{"sku": it["sku"], "name": it["name"], "price": it["price"]} for it in ITEMS[:k]]}


@app.get("/inventory")
def inventory(sku: str = "SKU-0") -> dict[str, Any]:
    return {"sku": sku, "qty": 100 if sku in BY_SKU else 0}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--port", type=int, default=8003)
    ap.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    args = ap.parse_args(argv)
    uvicorn.run(
        "sandboxd.bench.baselines.b3_worker:app",
        host="127.0.0.1",
        port=args.port,
        workers=args.workers,
        log_level="warning",
        access_log=False,
    )


if __name__ == "__main__":
    main()
