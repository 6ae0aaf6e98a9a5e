"""Modules that run inside an E2B sandbox's own interpreter, never in sandboxd's processes.

Their text is sent in a session cell (``cells.module_cell``) and built there into a module of its own, so they
use the standard library alone and import nothing of sandboxd. They are files here so that ruff and strict
mypy read them like any other module (``tests/test_units.py`` checks that sandboxd never imports them).
"""
