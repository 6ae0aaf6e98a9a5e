"""The jail core every jailed kind composes (``python``, ``code``; the next ones too).

- ``jail.py``: one nsjail jail holding a warm zygote, and the executors it forks; ``nsjail.py`` its
  configuration (mounts, namespaces, rlimits, the jail-wide seccomp filter, the interpreter); ``exchange.py``
  one execution's exchange (request, output with caps, deadline, exit status from the zygote).
- ``executions.py``: running one execution in an executor and reading what happened: limit hits through its
  cgroup's counters, a kill from above (the node's, never the program's), CPU starvation, the observation and
  the program's own verdict.
- ``pool.py``: the one-shot slots of a kind: a jail and a cgroup per slot, an executor prepared before each
  request, templates per environment, cold jails without a warm pool, healing.
- ``jailside/``: what runs inside a jail (stdlib only): the zygote, the executor's harness, seccomp, Landlock,
  forks of a session.

Cgroups (``runners/cgroups.py``) and the starvation rule (``runners/starvation.py``) are shared with the
node's budget and the browser's jails, and stay beside the kinds.
"""
