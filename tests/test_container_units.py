"""The container kind's pure parts: Docker's rules for a command and an environment, and the two sides'
agreement on where the store's layers are."""

from __future__ import annotations

from typing import Any

import pytest

from sandboxd.errors import BadRequest
from sandboxd.images.store import Image, RunConfig
from sandboxd.runners.container import runner
from sandboxd.runners.container.models import ContainerAction


def image(**run: Any) -> Image:
    layers = ["sha256:" + "a" * 64, "sha256:" + "b" * 64]
    return Image("demo:1", "sha256:" + "0" * 64, "amd64", layers, 1, RunConfig(**run), 0.0)


def test_a_command_follows_dockers_rule() -> None:
    img = image(entrypoint=["/entry", "-x"], cmd=["default"])
    assert runner.ContainerRunner.argv(img, None) == ["/entry", "-x", "default"]
    assert runner.ContainerRunner.argv(img, ["mine"]) == ["/entry", "-x", "mine"]  # Cmd replaced
    assert runner.ContainerRunner.argv(img, "echo $X") == ["/bin/sh", "-c", "echo $X"]  # a shell, no Entrypoint
    with pytest.raises(BadRequest, match="has no Entrypoint or Cmd"):
        runner.ContainerRunner.argv(image(), None)


def test_the_root_spec_layers_the_environment_over_the_images() -> None:
    img = image(env=["PATH=/bin", "A=1", "EMPTY="], working_dir="/w", user="1000")
    spec = runner.ContainerRunner.root_spec(img, {"A": "2", "B": "x=y"}, None, None)
    assert spec["layers"] == ["a" * 64, "b" * 64] and spec["user"] == "1000" and spec["workdir"] == "/w"
    assert spec["env"] == ["PATH=/bin", "A=2", "EMPTY=", "B=x=y"]
    spec = runner.ContainerRunner.root_spec(img, {}, "root", "/elsewhere")
    assert spec["user"] == "root" and spec["workdir"] == "/elsewhere"
    assert runner.ContainerRunner.root_spec(image(), {}, None, None)["workdir"] == "/"


def test_a_sessions_command_from_a_list_is_quoted() -> None:
    assert ContainerAction(cmd=["echo", "a b", "$HOME"]).command() == "echo 'a b' '$HOME'"
    assert ContainerAction(cmd="ls -l").command() == "ls -l"


def test_both_sides_name_one_place_for_the_layers() -> None:
    import sandboxd.runners.jail.jailside.zygote  # noqa: F401  # first: it puts its siblings on the path
    from sandboxd.runners.jail.jailside import rootfs

    assert rootfs.LAYERS == runner.LAYERS
    # The overlay's options fit a page at the most layers a sandbox stacks.
    longest = ":".join(f"{'f' * 64}/fs" for _ in range(runner.MAX_LAYERS))
    assert len(f"userxattr,lowerdir={longest},upperdir=/tmp/upper,workdir=/tmp/work") < 4096
