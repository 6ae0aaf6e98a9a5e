"""The parts of other packages that sandboxd relies on beyond their documented API, and the bounds that keep an
unpinned install (``pip install 'sandboxd[server]'``) on releases where they hold.

The front door (``sandboxd/front/protocol.py``) extends uvicorn's httptools protocol: it overrides its
callbacks and ``_start_asgi_task``, queues refusals in its ``pipeline``, pauses its ``flow`` and swaps its
``cycle``. A uvicorn release may rename any of these without notice; these tests say which one went and where
it is used, instead of a front door that fails on its first pipelined request. Raising uvicorn's upper bound in
``pyproject.toml`` means reading the new release's ``httptools_impl.py``, then running these and the front
door's tests on it.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import re
import socket
import tomllib
from pathlib import Path
from typing import NoReturn

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
USED_BY = "sandboxd/front/protocol.py"


def _installed(name: str) -> Version:
    from importlib.metadata import version

    return Version(version(name))


def _fail(what: str) -> NoReturn:
    pytest.fail(
        f"uvicorn {_installed('uvicorn')} changed {what}, which {USED_BY} relies on: read this release's "
        "uvicorn/protocols/http/httptools_impl.py and adapt the front door before allowing it in pyproject.toml"
    )


def test_uvicorn_httptools_protocol_has_what_the_front_door_overrides() -> None:
    from uvicorn.protocols.http import httptools_impl

    protocol = getattr(httptools_impl, "HttpToolsProtocol", None)
    if protocol is None:
        _fail("httptools_impl.HttpToolsProtocol (the class the front door subclasses)")
    if not isinstance(getattr(httptools_impl, "STATUS_LINE", None), dict):
        _fail("httptools_impl.STATUS_LINE (the status lines the front door writes its refusals with)")
    overridden = [
        "connection_made", "connection_lost", "on_message_begin", "on_url", "on_header", "on_headers_complete",
        "on_body", "on_message_complete", "handle_websocket_upgrade", "on_response_complete", "_start_asgi_task",
    ]  # fmt: skip
    for name in overridden:
        if not callable(getattr(protocol, name, None)):
            _fail(f"HttpToolsProtocol.{name} (overridden or called)")
    if list(inspect.signature(protocol._start_asgi_task).parameters) != ["self", "cycle", "app"]:
        _fail(
            f"the signature of HttpToolsProtocol._start_asgi_task, now {inspect.signature(protocol._start_asgi_task)}"
        )
    begin = inspect.getsource(protocol.on_message_begin)
    if "self.url = " not in begin or "self.headers = " not in begin:
        _fail("on_message_begin (it starts each request's url and headers, which the front door adds to)")
    # A pipelined request (and a queued refusal) is started by the response before it completing: the front
    # door's refusals ride on this hand-over.
    resume = inspect.getsource(protocol.on_response_complete)
    if not re.search(r"self\.pipeline\.pop\(\)[\s\S]*self\._start_asgi_task\(", resume):
        _fail("how on_response_complete starts the next pipelined request (pipeline.pop() into _start_asgi_task)")


def test_a_connected_uvicorn_protocol_has_the_state_the_front_door_reads() -> None:
    """A real protocol on a real socket: the instance attributes exist once the connection is made."""
    import uvicorn
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    from uvicorn.server import ServerState

    async def app(scope: object, receive: object, send: object) -> None:  # never called
        raise AssertionError

    async def connect() -> HttpToolsProtocol:
        config = uvicorn.Config(app, http="httptools", log_config=None)
        config.load()
        ours, theirs = socket.socketpair()
        try:
            protocol = HttpToolsProtocol(config, ServerState(), app_state={})
            await asyncio.get_running_loop().connect_accepted_socket(lambda: protocol, ours)
            try:
                missing = [
                    name
                    for name in ("transport", "flow", "parser", "pipeline", "cycle", "tasks", "server_state",
                                 "connections", "expect_100_continue", "loop")
                    if not hasattr(protocol, name)
                ]  # fmt: skip
                if missing:
                    _fail(f"the HttpToolsProtocol attributes {missing}")
                if not isinstance(protocol.pipeline, collections.deque):
                    _fail(f"HttpToolsProtocol.pipeline's type (now {type(protocol.pipeline).__name__}, was a deque)")
                for name in ("pause_reading", "resume_reading"):
                    if not callable(getattr(protocol.flow, name, None)):
                        _fail(f"FlowControl.{name}")
                if not callable(getattr(protocol.parser, "should_keep_alive", None)):
                    _fail("the parser's should_keep_alive")
                return protocol
            finally:
                protocol.transport.close()
        finally:
            theirs.close()

    asyncio.run(connect())


def test_uvicorn_request_cycle_has_the_fields_the_front_door_reads() -> None:
    from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

    init = inspect.getsource(RequestResponseCycle.__init__)
    for name in ("response_complete", "response_started", "more_body", "body", "disconnected", "keep_alive",
                 "message_event", "flow"):  # fmt: skip
        if f"self.{name} " not in init and f"self.{name}:" not in init:
            _fail(f"RequestResponseCycle.{name}")


def _server_requirements() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["server"]]
    return {r.name: r for r in reqs}


def _pins() -> dict[str, Version]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        name, sep, version = line.split("#")[0].strip().partition("==")
        if sep:
            pins[name.lower()] = Version(version)
    return pins


@pytest.mark.parametrize("name", ["uvicorn"])
def test_a_package_used_beyond_its_api_is_bounded_to_the_release_line_the_tests_ran(name: str) -> None:
    """An unpinned install resolves inside the bound; the bound stops before the first release not read.

    The pin (constraints.txt) is what the tests run; the bound allows that release line and nothing newer, so
    a new release reaches users only after someone raises the bound with the contract tests above passing.
    """
    requirement, pinned = _server_requirements()[name], _pins()[name]
    assert requirement.specifier.contains(pinned), f"{name} {pinned} (constraints.txt) is outside {requirement}"
    assert pinned == _installed(name), f"the tests run {name} {_installed(name)}, constraints.txt pins {pinned}"
    uppers = [Version(s.version) for s in requirement.specifier if s.operator == "<"]
    assert uppers, f"{name} has no upper bound in pyproject.toml: {requirement}"
    major, minor = (*pinned.release, 0)[:2]
    next_line = Version(f"{major}.{minor + 1}")  # a minor release may change what is not the API
    assert min(uppers) <= next_line, f"{requirement} allows releases after {pinned}'s line, which no test has read"


def test_every_server_dependency_admits_the_release_the_tests_ran() -> None:
    """constraints.txt and pyproject.toml agree: no test ran a version an install from the index could not get."""
    pins = _pins()
    outside = [
        f"{name} {pins[name]} not in {req}"
        for name, req in _server_requirements().items()
        if name in pins and not req.specifier.contains(pins[name], prereleases=True)
    ]
    assert not outside
