"""The node's budget for its sandboxes: what its cgroup (or host) allows, less what its own processes need.

Computed once in the node process at start (``ledger.py`` charges against it). The kinds say what they
hold (``RunnerConfig.pool_reservation`` per instance, ``session_reservation`` per session); the node
multiplies the pools by the workers that host each kind.
"""

from __future__ import annotations

import logging

from sandboxd.config import NodeSettings
from sandboxd.node.ledger import Budget
from sandboxd.runners.base import Reservation
from sandboxd.runners.cgroups import ceilings

log = logging.getLogger(__name__)


def node_budget(settings: NodeSettings) -> Budget:
    memory, pids = ceilings()
    memory = (settings.memory_budget_mb << 20) or max(0, memory - (settings.memory_reserve_mb << 20))
    pids = settings.pids_budget or max(0, pids - settings.pids_reserve)
    limit = Reservation(int(memory * settings.overcommit), int(pids * settings.overcommit))
    pools = Reservation()
    per_session: dict[str, Reservation] = {}
    for name in settings.runners:
        cfg = settings.runner_config(name)
        pools = pools + cfg.pool_reservation().times(len(settings.hosting(name)))
        per_session[name] = cfg.session_reservation()
    budget = Budget(limit, pools, per_session)
    if pools.memory_bytes > limit.memory_bytes or pools.pids > limit.pids:
        log.warning(
            "the warm pools alone (%d MiB, %d pids at their limits) pass this node's budget x overcommit "
            "(%d MiB, %d pids): sessions that reserve memory or pids are refused; raise overcommit or the budget",
            pools.memory_bytes >> 20,
            pools.pids,
            limit.memory_bytes >> 20,
            limit.pids,
        )
    return budget
