"""Bench results in S3: upload a run's files, read every machine's summaries back.

Operators run ``sandboxd bench`` on each candidate machine and compare in one
place; a bucket is that place. Credentials come from the standard AWS chain
(environment, shared config and credentials files, instance or pod role);
``--s3-endpoint-url`` or ``AWS_ENDPOINT_URL`` (read by botocore itself) points
at an S3-compatible store. Every call has bounded timeouts and retries, so a
wrong endpoint ends in a clear error, never a hang.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CONTENT_TYPES = {".json": "application/json", ".html": "text/html; charset=utf-8"}
SUMMARY = "summary.json"


class S3Error(Exception):
    """An S3 location that is malformed, unreachable, refused or empty; the message says which."""


@dataclass(frozen=True)
class Location:
    bucket: str
    prefix: str  # "" or ending in "/"

    @classmethod
    def parse(cls, url: str) -> Location:
        if not url.startswith("s3://"):
            raise S3Error(f"{url!r} is not an s3:// URL (expected s3://bucket/prefix)")
        bucket, _, prefix = url[len("s3://") :].partition("/")
        if not bucket:
            raise S3Error(f"{url!r} names no bucket (expected s3://bucket/prefix)")
        prefix = prefix.strip("/")
        return cls(bucket, prefix + "/" if prefix else "")

    def url(self, key: str = "") -> str:
        return f"s3://{self.bucket}/{key or self.prefix}"


def is_s3(location: str) -> bool:
    return location.startswith("s3://")


def _client(endpoint_url: str | None) -> Any:
    from aiobotocore.session import get_session
    from botocore.config import Config

    config = Config(
        connect_timeout=5, read_timeout=30, retries={"max_attempts": 3, "mode": "standard"}, user_agent_extra="sandboxd"
    )
    return get_session().create_client("s3", endpoint_url=endpoint_url, config=config)


def _reason(exc: BaseException) -> str:
    from botocore.exceptions import ClientError

    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {})
        return f"{err.get('Code', 'error')}: {err.get('Message', '') or exc}"
    return f"{type(exc).__name__}: {exc}"


async def _upload(files: list[tuple[Path, str]], loc: Location, endpoint_url: str | None) -> list[str]:
    from botocore.exceptions import BotoCoreError, ClientError

    done: list[str] = []
    try:
        async with _client(endpoint_url) as s3:
            for path, key in files:
                await s3.put_object(
                    Bucket=loc.bucket,
                    Key=key,
                    Body=path.read_bytes(),
                    ContentType=CONTENT_TYPES.get(path.suffix, "application/octet-stream"),
                )
                done.append(loc.url(key))
    except (TimeoutError, BotoCoreError, ClientError, OSError, ValueError) as exc:
        raise S3Error(f"upload to {loc.url()} failed after {len(done)} of {len(files)} files: {_reason(exc)}") from exc
    return done


async def _check(loc: Location, endpoint_url: str | None) -> str | None:
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        async with _client(endpoint_url) as s3:
            await s3.head_bucket(Bucket=loc.bucket)
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code in ("403", "AccessDenied", "Forbidden"):  # upload-only credentials may not see the bucket
            return f"cannot check s3://{loc.bucket} ({code}); the upload will tell"
        raise S3Error(f"s3://{loc.bucket} is not usable: {_reason(exc)}") from exc
    except (TimeoutError, BotoCoreError, OSError, ValueError) as exc:
        raise S3Error(f"s3://{loc.bucket} is not reachable: {_reason(exc)}") from exc
    return None


def check(url: str, endpoint_url: str | None = None) -> str | None:
    """Before an hour of benchmarking: the URL, the endpoint, the credentials and the bucket.

    Raises S3Error when the upload cannot work; returns a warning when it
    cannot tell (credentials allowed to put objects but not to see the bucket).
    """
    return asyncio.run(_check(Location.parse(url), endpoint_url))


def upload_run(run_dir: Path, out_root: Path, url: str, endpoint_url: str | None = None) -> list[str]:
    """Upload every file of ``run_dir`` under the prefix, keeping its path below ``out_root``.

    The key layout (``<prefix>/<arch>/<type>_<time>/...``) is the local one, so
    many machines can share one prefix without overwriting each other.
    """
    loc = Location.parse(url)
    files = [(p, loc.prefix + p.relative_to(out_root).as_posix()) for p in sorted(run_dir.rglob("*")) if p.is_file()]
    return asyncio.run(_upload(files, loc, endpoint_url))


async def _read_summaries(loc: Location, endpoint_url: str | None) -> list[tuple[str, dict[str, Any]]]:
    from botocore.exceptions import BotoCoreError, ClientError

    out: list[tuple[str, dict[str, Any]]] = []
    try:
        async with _client(endpoint_url) as s3:
            keys: list[str] = []
            async for page in s3.get_paginator("list_objects_v2").paginate(Bucket=loc.bucket, Prefix=loc.prefix):
                keys += [o["Key"] for o in page.get("Contents", []) if o["Key"].rsplit("/", 1)[-1] == SUMMARY]
            for key in sorted(keys):
                obj = await s3.get_object(Bucket=loc.bucket, Key=key)
                async with obj["Body"] as body:
                    raw = await body.read()  # aiohttp errors while reading surface as OSError/TimeoutError
                try:
                    out.append((loc.url(key), json.loads(raw)))
                except ValueError as exc:
                    raise S3Error(f"{loc.url(key)} is not JSON: {exc}") from exc
    except (TimeoutError, BotoCoreError, ClientError, OSError, ValueError) as exc:
        raise S3Error(f"reading {loc.url()} failed: {_reason(exc)}") from exc
    if not out:
        raise S3Error(f"no {SUMMARY} under {loc.url()}")
    return out


def read_summaries(url: str, endpoint_url: str | None = None) -> list[tuple[str, dict[str, Any]]]:
    """(s3 URL, parsed summary.json) of every run stored under the prefix."""
    return asyncio.run(_read_summaries(Location.parse(url), endpoint_url))
