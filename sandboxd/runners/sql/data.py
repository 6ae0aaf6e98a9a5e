"""Shared, read-only TPC-H data, generated once with DuckDB's tpch extension.

The extension comes from the PyPI package ``duckdb-extension-tpch`` (it pins
``duckdb`` exactly; nothing is downloaded at run time). Generation happens
once per (scale factor, duckdb version) under a file lock, so the workers of a
node that start together build it once; the 22 query texts are saved beside
the database because the serving connections cannot load extensions.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path

import duckdb


def extension_path() -> Path:
    import duckdb_extension_tpch

    root = Path(duckdb_extension_tpch.__file__).parent / "extensions"
    found = sorted(root.glob(f"v{duckdb.__version__}/tpch.duckdb_extension"))
    if not found:
        raise FileNotFoundError(f"no tpch extension for duckdb {duckdb.__version__} under {root}")
    return found[0]


def ensure(data_dir: Path, scale_factor: float) -> tuple[Path, list[str]]:
    """Path of the TPC-H database for ``scale_factor`` and its 22 queries; build them if missing."""
    data_dir.mkdir(parents=True, exist_ok=True)
    stem = f"tpch-sf{scale_factor:g}-duckdb{duckdb.__version__}"
    db, queries = data_dir / f"{stem}.duckdb", data_dir / f"{stem}.queries.json"
    with open(data_dir / f"{stem}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (db.exists() and queries.exists()):
            tmp = db.with_suffix(".building")
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            con = duckdb.connect(str(tmp))
            try:
                con.execute(f"LOAD '{extension_path()}'")
                con.execute(f"CALL dbgen(sf={float(scale_factor)})")
                texts = [
                    q for _, q in con.execute("SELECT query_nr, query FROM tpch_queries() ORDER BY query_nr").fetchall()
                ]
            finally:
                con.close()
            os.replace(tmp, db)
            queries.write_text(json.dumps(texts))
    return db, json.loads(queries.read_text())
