"""``python -m sandboxd.node``: the node process alone (for front processes that someone else runs)."""

from sandboxd.node.serve import main

main()
