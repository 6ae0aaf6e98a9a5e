"""A sql session's own objects, read out of its engine and made again in another (stdlib only: engine side).

Why not fork the engine process: DuckDB runs a thread pool, and a fork copies
one thread (the others' locks stay held in the copy). So a fork of a sql
session reads what the session made in its connection (temp tables with their
rows, views, macros, sequences at their current value, indexes, variables)
from DuckDB's catalog, and each copy's fresh engine makes them again, in the
order they were made. The database itself is read-only and shared: only what
the session made is copied. What cannot be read back is said per object.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import math
import uuid
from typing import Any

INT64 = 1 << 63


def _enc(v: Any) -> Any:
    """A value as JSON that ``_dec`` turns back into the same Python value (and DuckDB into the same type)."""
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        return v if -INT64 <= v < INT64 else {"$i": str(v)}
    if isinstance(v, float):
        return v if math.isfinite(v) else {"$f": repr(v)}
    if isinstance(v, (bytes, bytearray, memoryview)):
        return {"$b": base64.b64encode(bytes(v)).decode()}
    if isinstance(v, decimal.Decimal):
        return {"$d": str(v)}
    if isinstance(v, datetime.datetime):
        return {"$dt": v.isoformat()}
    if isinstance(v, datetime.date):
        return {"$date": v.isoformat()}
    if isinstance(v, datetime.time):
        return {"$t": v.isoformat()}
    if isinstance(v, datetime.timedelta):
        return {"$td": [v.days, v.seconds, v.microseconds]}
    if isinstance(v, uuid.UUID):
        return {"$u": str(v)}
    if isinstance(v, (list, tuple)):
        return [_enc(x) for x in v]
    if isinstance(v, dict):
        return {"$s": [[_enc(k), _enc(x)] for k, x in v.items()]}
    raise TypeError(f"a value of type {type(v).__name__}")


def _dec(v: Any) -> Any:
    if isinstance(v, list):
        return [_dec(x) for x in v]
    if not isinstance(v, dict):
        return v
    ((tag, x),) = v.items()
    if tag == "$i":
        return int(x)
    if tag == "$f":
        return float(x)
    if tag == "$b":
        return base64.b64decode(x)
    if tag == "$d":
        return decimal.Decimal(x)
    if tag == "$dt":
        return datetime.datetime.fromisoformat(x)
    if tag == "$date":
        return datetime.date.fromisoformat(x)
    if tag == "$t":
        return datetime.time.fromisoformat(x)
    if tag == "$td":
        return datetime.timedelta(days=x[0], seconds=x[1], microseconds=x[2])
    if tag == "$u":
        return uuid.UUID(x)
    if tag == "$s":
        return {_dec(k): _dec(val) for k, val in x}
    raise ValueError(f"unknown tag {tag}")


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def export(con: Any, max_bytes: int) -> dict[str, Any]:
    """The session's objects in the order they were made, each with the statement that makes it again;
    temp tables with their rows. ``{"error": ...}`` when the rows pass ``max_bytes`` (JSON)."""
    objects: list[tuple[int, dict[str, Any]]] = []
    notes: list[str] = []
    size = 0
    for oid, name, sql in con.execute(
        "SELECT table_oid, table_name, sql FROM duckdb_tables() WHERE temporary ORDER BY table_oid"
    ).fetchall():
        rows = [[_enc(v) for v in row] for row in con.execute(f"SELECT * FROM temp.main.{_quote(name)}").fetchall()]
        size += len(str(rows))
        if size > max_bytes:
            return {"error": f"the session's temp tables hold more than {max_bytes} bytes (at table {name!r})"}
        objects.append((oid, {"kind": "table", "name": name, "sql": sql, "rows": rows}))
    for oid, name, sql in con.execute(
        "SELECT view_oid, view_name, sql FROM duckdb_views() WHERE temporary AND NOT internal ORDER BY view_oid"
    ).fetchall():
        objects.append((oid, {"kind": "view", "name": name, "sql": sql}))
    macros = con.execute(
        "SELECT function_oid, function_name, function_type, parameters, macro_definition FROM duckdb_functions() "
        "WHERE database_name = 'temp' AND NOT internal AND function_type IN ('macro', 'table_macro') "
        "ORDER BY function_oid"
    ).fetchall()
    by_name: dict[str, list[tuple[int, str, list[str], str]]] = {}
    for oid, name, kind, params, body in macros:
        by_name.setdefault(name, []).append((oid, kind, list(params or []), str(body)))
    for name, overloads in by_name.items():
        table = overloads[0][1] == "table_macro"
        parts = [
            f"({', '.join(_quote(p) for p in params)}) AS {'TABLE ' if table else ''}{body}"
            for _, _, params, body in overloads
        ]
        sql = f"CREATE TEMP MACRO {_quote(name)}{', '.join(parts)}"
        objects.append((overloads[0][0], {"kind": "macro", "name": name, "sql": sql}))
    if by_name:
        notes.append("sql: macros are made again from their definitions; default parameter values (:=) are not kept")
    for oid, name, sql in con.execute(
        "SELECT sequence_oid, sequence_name, sql FROM duckdb_sequences() WHERE temporary ORDER BY sequence_oid"
    ).fetchall():
        sql = sql.replace("CREATE SEQUENCE", "CREATE TEMP SEQUENCE", 1)  # at its current value (its START)
        objects.append((oid, {"kind": "sequence", "name": name, "sql": sql}))
    objects.sort(key=lambda o: o[0])
    ordered = [o for _, o in objects]
    for name, sql in con.execute(
        "SELECT index_name, sql FROM duckdb_indexes() WHERE database_name = 'temp' AND sql IS NOT NULL"
    ).fetchall():
        ordered.append({"kind": "index", "name": name, "sql": sql})  # after the rows: built once
    for name, value, typ in con.execute("SELECT name, value, type FROM duckdb_variables()").fetchall():
        ordered.append(
            {
                "kind": "variable",
                "name": name,
                "sql": f"SET VARIABLE {_quote(name)} = CAST(? AS {typ})",
                "args": [value],
            }
        )
    notes.append("sql: prepared statements (PREPARE) are not copied")
    return {"objects": ordered, "notes": notes}


def restore(con: Any, state: dict[str, Any]) -> dict[str, Any]:
    """Make ``state``'s objects in this engine's connection. An object whose statement fails (it depends on
    one made later, after a CREATE OR REPLACE) is tried again after the others; one that still fails is an
    error naming it."""
    pending = list(state.get("objects") or [])
    for _ in range(4):
        failed: list[tuple[dict[str, Any], str]] = []
        for obj in pending:
            try:
                _make(con, obj)
            except Exception as exc:
                failed.append((obj, str(exc)))
        if not failed or len(failed) == len(pending):
            break
        pending = [obj for obj, _ in failed]
    if failed:
        obj, why = failed[0]
        return {"error": f"{obj['kind']} {obj['name']!r} could not be made in the copy: {why}"}
    return {"ok": True}


def _make(con: Any, obj: dict[str, Any]) -> None:
    con.execute(obj["sql"], obj.get("args") or None)
    rows = obj.get("rows")
    if rows:
        marks = ", ".join("?" * len(rows[0]))
        con.executemany(f"INSERT INTO temp.main.{_quote(obj['name'])} VALUES ({marks})", [_dec(r) for r in rows])
