"""Instance prices and the cost formulas of the public suite, with m7i/m8i/m8g/m9g rows.

The table lives in ``data/prices.json`` (on-demand $/h, editable): per family a
price for the 4xlarge size, scaled linearly by vCPU count like the public suite
does. Cost per 1k units = price_h x 1000 / (3600 x units_per_s); $/1M = x1000.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

PRICES = Path(__file__).parent / "data" / "prices.json"
SIZE_VCPUS = {
    "large": 2, "xlarge": 4, "2xlarge": 8, "4xlarge": 16, "8xlarge": 32, "12xlarge": 48,
    "16xlarge": 64, "24xlarge": 96, "48xlarge": 192,
}  # fmt: skip


@dataclass(frozen=True)
class InstanceType:
    name: str
    vcpus: int
    hourly_usd: float
    arch: str


def load_table(path: Path = PRICES) -> dict[str, InstanceType]:
    data = json.loads(path.read_text())
    out: dict[str, InstanceType] = {}
    for family, info in data["families"].items():
        for size in info.get("sizes", list(SIZE_VCPUS)):
            vcpus = SIZE_VCPUS[size]
            out[f"{family}.{size}"] = InstanceType(
                f"{family}.{size}", vcpus, round(info["price_4xlarge_usd"] * vcpus / 16, 4), info["arch"]
            )
    return out


def hourly_price(instance_type: str, table: dict[str, InstanceType] | None = None) -> float:
    """$/h of ``instance_type``, 0.0 when unknown (cost then comes out null)."""
    table = table if table is not None else load_table()
    it = table.get(instance_type)
    if it is not None:
        return it.hourly_usd
    m = re.fullmatch(r"([a-z0-9]+)\.([0-9]*x?large)", instance_type)
    if m and m.group(2) in SIZE_VCPUS:
        base = next((t for t in table.values() if t.name.startswith(m.group(1) + ".")), None)
        if base is not None:
            return round(base.hourly_usd / base.vcpus * SIZE_VCPUS[m.group(2)], 4)
    return 0.0


def cost_per_1k(price_h: float, units_per_s: float) -> float | None:
    if price_h <= 0 or units_per_s <= 0:
        return None
    return round(price_h * 1000 / (3600 * units_per_s), 6)
