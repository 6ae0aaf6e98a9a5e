"""GET /images on a node: the store's images as a tenant sees them (tests/test_images.py builds them)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from sandboxd.images.store import ImageStore
from tests.conftest import running_node
from tests.test_images import BASE, IDS, LIMITS, TOP, oci_layout, sha

pytestmark = pytest.mark.node


async def test_a_node_lists_its_images(tmp_path: Path) -> None:
    store = ImageStore(tmp_path / "store", LIMITS, IDS)
    store.import_image(oci_layout(tmp_path / "oci", [BASE, TOP], WorkingDir="/data", Cmd=["sh"]))
    key = "images-tenant-0123456789"
    with running_node(runners='["tools"]', workers=1, images_dir=str(store.root), api_keys=f'["{key}"]') as base:
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            denied = await http.get("/images")
            assert denied.status_code == 401 and denied.json()["error"]["blame"] == "client"
            r = await http.get("/images", headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200, r.text
    (image,) = r.json()["images"]
    assert image["name"] == "demo:1" and image["layers"] == [sha(BASE), sha(TOP)]
    assert image["run"]["working_dir"] == "/data" and image["run"]["cmd"] == ["sh"] and image["size"] > 0
