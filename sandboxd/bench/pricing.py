"""Instance prices and the cost formulas of the public suite, with m7i/m8i/m8g/m9g rows.

The table lives in ``data/prices.json`` (on-demand $/h, editable, or another
file through ``--prices``): per family a price for the 4xlarge size, the date
it was recorded and its source, scaled linearly by vCPU count like AWS prices
these families and the public suite does. Cost per 1k units = price_h x 1000 /
(3600 x units_per_s); $/1M = x1000.
"""

from __future__ import annotations

import json
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
    basis: str  # "list" (a published price) or "estimate" (derived; the source says how)
    date: str
    source: str

    @property
    def family(self) -> str:
        return self.name.split(".")[0]

    @property
    def size(self) -> str:
        return self.name.split(".")[1]


@dataclass(frozen=True)
class PriceTable:
    types: dict[str, InstanceType]
    study_sizes: tuple[str, ...]  # the sizes the study measured: what `size` shows unless told otherwise
    about: str
    path: Path

    def families(self) -> dict[str, InstanceType]:
        """One row per family (its 4xlarge), for the report's price table."""
        return {t.family: t for t in self.types.values() if t.size == "4xlarge"}


def load(path: Path = PRICES) -> PriceTable:
    data = json.loads(path.read_text())
    types: dict[str, InstanceType] = {}
    for family, info in data["families"].items():
        for size in info.get("sizes", list(SIZE_VCPUS)):
            vcpus = SIZE_VCPUS[size]
            name = f"{family}.{size}"
            types[name] = InstanceType(
                name,
                vcpus,
                round(info["price_4xlarge_usd"] * vcpus / 16, 5),
                info["arch"],
                info.get("basis", "list"),
                info.get("date", "undated"),
                info.get("source", "unknown"),
            )
    return PriceTable(types, tuple(data.get("study_sizes", ["4xlarge"])), data.get("about", ""), path)


def load_table(path: Path = PRICES) -> dict[str, InstanceType]:
    return load(path).types


def hourly_price(instance_type: str, table: dict[str, InstanceType] | None = None) -> float:
    """$/h of ``instance_type``, 0.0 when unknown (cost then comes out null)."""
    table = table if table is not None else load_table()
    it = table.get(instance_type)
    return it.hourly_usd if it is not None else 0.0


def cost_per_1k(price_h: float, units_per_s: float) -> float | None:
    if price_h <= 0 or units_per_s <= 0:
        return None
    return round(price_h * 1000 / (3600 * units_per_s), 6)
