"""Do sandboxes of one image share its pages? N container sessions each read the same file of the image; the
memory their cgroups are charged, in all, against N times the file.

    SANDBOXD_IMAGES_DIR=... python -m sandboxd.bench.imageshare --image NAME --file /path/in/image [--sessions 16]

The layers are one set of files on the node's disk, under every sandbox's overlay: a page of the image read by
one sandbox is in the page cache for all of them (charged to the group that read it first). Drop the page
cache first (``echo 3 > /proc/sys/vm/drop_caches``) for the first reader to pay for it all.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os

import httpx

from sandboxd.localnode import local_node


def charged() -> dict[str, int]:
    """Memory charged to each container session's group (cgroup v1 or v2) of the node's worker 0."""
    out: dict[str, int] = {}
    for name in ("memory.usage_in_bytes", "memory.current"):
        for path in glob.glob(f"/sys/fs/cgroup/**/*-w0-container/sessions/x*/{name}", recursive=True):
            with open(path) as f:
                out[path] = int(f.read())
    return out


async def measure(base: str, image: str, path: str, n: int) -> dict[str, object]:
    async with httpx.AsyncClient(base_url=base, timeout=300) as http:
        sids = []
        for _ in range(n):
            r = await http.post("/sessions", json={"runner": "container", "options": {"image": image}})
            r.raise_for_status()
            sids.append(r.json()["session_id"])
        before = charged()
        action = {"cmd": f"cat {path} > /dev/null && echo read"}
        steps = [{"runner": "container", "session_id": s, "timeout_s": 120, "action": action} for s in sids]
        answers = await asyncio.gather(*(http.post("/rollout/step", json=step) for step in steps))
        failed = [a.text[:300] for a in answers if a.json().get("observation", {}).get("stdout") != "read\n"]
        if failed:
            raise SystemExit(f"{len(failed)} sessions could not read {path}: {failed[0]}")
        after = charged()
    grew = sorted(after[k] - before.get(k, 0) for k in after)
    return {"sessions": n, "charged_mib": round(sum(grew) / 2**20, 1), "largest_mib": round(grew[-1] / 2**20, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--image", required=True)
    ap.add_argument("--file", required=True, help="a large file of the image")
    ap.add_argument("--sessions", type=int, default=16)
    args = ap.parse_args()
    settings = {
        "SANDBOXD_RUNNERS": '["container"]',
        "SANDBOXD_WORKERS": "1",
        "SANDBOXD_CONTAINER__MAX_SESSIONS_PER_WORKER": str(max(64, args.sessions)),
        "SANDBOXD_IMAGES_DIR": os.environ.get("SANDBOXD_IMAGES_DIR", "/var/lib/sandboxd/images"),
    }
    with local_node(settings) as base:
        size = httpx.post(
            f"{base}/rollout/step",
            json={"runner": "container", "action": {"image": args.image, "cmd": f"wc -c < {args.file}"}},
            timeout=120,
        ).json()["observation"]["stdout"]
        result = asyncio.run(measure(base, args.image, args.file, args.sessions))
    file_mib = int(size) / 2**20
    result.update(file_mib=round(file_mib, 1), if_not_shared_mib=round(file_mib * args.sessions, 1))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
