"""The workload registry: what ``sandboxd bench`` and the baseline comparisons replay.

A workload names itself (id, name, title, unit, throughput key, seeds as the
public suite does, so results compare with its tables), generates its
operations (``setup``: the corpus or trajectory pool, built once per load
process) and checks each one (``op`` grades the result: ``passed``). One op is
one unit of the workload (a program, a trajectory, a query, a batch of
episodes). ``listed`` workloads are what ``sandboxd bench`` offers; the others
exist for comparisons (``bench/python_vs_baseline.py``) and share the same
load generator (``loadgen.py``).

Adding a workload is a class here (on ``workload.Workload``) and one line in ``WORKLOADS``.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import shutil
from typing import Any, ClassVar

from sandboxd.bench.stats import summary
from sandboxd.bench.workload import Loop, OpResult, Samples, Workload, http_error, http_failure, pool_breakdown, step


class CodeExec(Workload):
    """B1: one self-contained program (solution + asserts) per op; exit 0 = pass."""

    id, name, title, unit = "B1", "codeexec", "CodeExec", "exec"
    rate_unit = "exec/s"
    runners = ("python",)
    throughput_key, seed_base = "executions_per_sec", 0xB1
    timeout_s = 10

    def setup(self, options: dict[str, Any]) -> list[str]:
        from sandboxd.bench.corpus import b1

        exclude = set(options.get("exclude", ()))
        programs = [p.source for p in b1() if p.task_id not in exclude]
        random.Random(42).shuffle(programs)
        return programs

    async def op(self, loop: Loop) -> OpResult:
        code = loop.shared[loop.rng.randrange(len(loop.shared))]
        body: dict[str, Any] = {"runner": "python", "action": {"code": code}, "timeout_s": self.timeout_s}
        if "session_id" in loop.state:
            body["session_id"] = loop.state["session_id"]
        status, result = await step(loop, body)
        if status != 200:
            return http_failure(status, result)
        return OpResult(passed=bool(result["ok"]))

    def extra(self, s: Samples) -> dict[str, Any]:
        from sandboxd.bench.corpus import humaneval, mbpp

        he, mb = len(humaneval()), len(mbpp())
        return {
            "corpus_size": he + mb,
            "corpus_breakdown": {"humaneval": he, "mbpp_sanitized": mb, "fallback": 0},
            "snippet_timeout_sec": self.timeout_s,
            "pass_rate": s.pass_rate,
            "graded": s.graded,
            "corpus_shuffle_seed": 42,
        }


class CodeExecSession(CodeExec):
    """B1's programs, each loop running them one after another in its own Python session."""

    id, name, title = "B1-session", "codeexec_session", "CodeExec in a session"
    listed = False

    async def begin(self, loop: Loop) -> None:
        status, info = await loop.conn.request("POST", "/sessions", {"runner": "python"})
        if status != 201:
            raise ConnectionError(http_error(status, info, " creating a session"))
        loop.state["session_id"] = info["session_id"]

    async def end(self, loop: Loop) -> None:
        if "session_id" in loop.state:
            await loop.conn.request("DELETE", f"/sessions/{loop.state['session_id']}")


class CodeExecFusion(CodeExec):
    """B1's programs through the SandboxFusion surface (``POST /run_code``), as verl sends them."""

    id, name, title = "B1-fusion", "codeexec_fusion", "CodeExec via /run_code"
    listed = False

    async def op(self, loop: Loop) -> OpResult:
        code = loop.shared[loop.rng.randrange(len(loop.shared))]
        body = {"code": code, "language": "python", "run_timeout": self.timeout_s, "compile_timeout": 10}
        status, result = await loop.conn.request("POST", "/run_code", body)
        if status != 200:
            return OpResult(error=f"HTTP {status} from /run_code: {str(result)[:200]}", blame="infra", status=status)
        if result.get("status") == "SandboxError":
            return OpResult(error=f"SandboxError: {result.get('message')}", blame="infra")
        return OpResult(passed=result["status"] == "Success")


class CppFusion(Workload):
    """A C++ solution graded on one of its tests per op, through ``POST /run_code`` (``cpp_cases.py``): what a
    code-contest trainer sends any SandboxFusion-compatible server. ``options["fresh"]``: every source new."""

    id, name, title, unit = "cpp-fusion", "cpp_fusion", "C++ cases via /run_code", "exec"
    rate_unit = "exec/s"
    throughput_key, seed_base = "executions_per_sec", 0xC99
    listed = False
    runners = ("code",)

    def setup(self, options: dict[str, Any]) -> list[Any]:
        from sandboxd.bench.cpp_cases import cases

        return cases()

    async def op(self, loop: Loop) -> OpResult:
        case = loop.shared[loop.rng.randrange(len(loop.shared))]
        source = case.source + (f"// {loop.rng.getrandbits(64):x}\n" if loop.options.get("fresh") else "")
        body = {"code": source, "language": "cpp", "stdin": case.stdin, "run_timeout": 10, "compile_timeout": 30}
        status, result = await loop.conn.request("POST", "/run_code", body)
        if status != 200:
            return OpResult(error=f"HTTP {status} from /run_code: {str(result)[:200]}", blame="infra", status=status)
        if result.get("status") == "SandboxError":
            return OpResult(error=f"SandboxError: {result.get('message')}", blame="infra")
        out = ((result.get("run_result") or {}).get("stdout") or "").strip()
        return OpResult(passed=result.get("status") == "Success" and out == case.expected, channel=case.problem)


class CodeExecBaseline(CodeExec):
    """B1's programs as a plain worker runs them: ``prlimit --cpu --as python -c`` per op, no HTTP."""

    id, name, title = "B1-baseline", "codeexec_prlimit", "CodeExec via prlimit python -c"
    listed = False

    async def op(self, loop: Loop) -> OpResult:
        code = loop.shared[loop.rng.randrange(len(loop.shared))]
        argv = [loop.options["python"], "-c", code]
        prlimit = shutil.which("prlimit")
        if prlimit:
            argv = [prlimit, "--cpu=10", f"--as={2 << 30}", *argv]
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
        )
        try:
            ok = await asyncio.wait_for(proc.wait(), self.timeout_s) == 0
        except TimeoutError:
            proc.kill()
            await proc.wait()
            ok = False
        return OpResult(passed=ok)


class ToolCall(Workload):
    """B3: one op = one whole trajectory (~11.6 calls) in a fresh tools session, created and closed by the op."""

    id, name, title, unit = "B3", "toolcall", "ToolCall", "trajectory"
    rate_unit = "traj/s"
    runners = ("tools",)
    throughput_key, seed_base = "trajectories_per_sec", 0xB3

    def setup(self, options: dict[str, Any]) -> list[tuple[str, list[tuple[str, dict[str, Any]]]]]:
        from sandboxd.bench.trajectories import build_pool

        return build_pool(42)

    async def op(self, loop: Loop) -> OpResult:
        name, steps = loop.shared[loop.rng.randrange(len(loop.shared))]
        status, info = await loop.conn.request("POST", "/sessions", {"runner": "tools"})
        if status != 201:
            return http_failure(status, info, " creating a session", channel=name)
        sid = info["session_id"]
        ok = True
        try:
            for tool, args in steps:
                body = {"runner": "tools", "action": {"tool": tool, "args": args}, "session_id": sid}
                status, result = await step(loop, body)
                if status != 200:
                    return http_failure(status, result, channel=name)
                ok = ok and result["observation"]["error"] is None
        finally:
            await loop.conn.request("DELETE", f"/sessions/{sid}")
        return OpResult(passed=ok, channel=name, steps=len(steps))

    def throughput(self, s: Samples, duration_s: float) -> dict[str, Any]:
        return {
            self.throughput_key: round(s.ops / duration_s, 3),
            "tool_calls_per_sec": round(s.steps / duration_s, 1),
            "total_trajectories": s.ops,
            "total_tool_calls": s.steps,
        }

    def extra(self, s: Samples) -> dict[str, Any]:
        from sandboxd.bench.trajectories import TEMPLATES

        return {
            **pool_breakdown(self.setup({}), TEMPLATES, 42, "avg_steps"),
            "avg_steps_per_trajectory": round(s.steps / s.ops, 2) if s.ops else None,
            "pass_rate": s.pass_rate,
            "per_template_latency_ms": {k: summary(v) for k, v in sorted(s.channels.items())},
            "note": "each op also creates and closes its session (2 of its HTTP calls)",
        }


class ToolCallBaseline(Workload):
    """B3 on the replica of the public suite's mock API (``baselines/b3_worker.py``): one op = one of the
    suite's own trajectories (~11.7 calls), every call as its default user, no session, nothing isolated."""

    id, name, title, unit = "B3-baseline", "toolcall-baseline", "ToolCall (suite's worker)", "trajectory"
    rate_unit = "traj/s"
    throughput_key, seed_base = "trajectories_per_sec", 0xB3
    listed = False

    def setup(self, options: dict[str, Any]) -> list[tuple[str, list[Any]]]:
        from sandboxd.bench.suite_b3 import build_pool

        return build_pool(42)

    async def op(self, loop: Loop) -> OpResult:
        name, calls = loop.shared[loop.rng.randrange(len(loop.shared))]
        for method, path, body in calls:
            status, result = await loop.conn.request(method, path, body)
            if status >= 300:
                return http_failure(status, result, channel=name)
        return OpResult(passed=True, channel=name, steps=len(calls))

    def throughput(self, s: Samples, duration_s: float) -> dict[str, Any]:
        return {self.throughput_key: round(s.ops / duration_s, 3), "tool_calls_per_sec": round(s.steps / duration_s, 1)}


class LightCall(Workload):
    """One light one-shot step per op (the call trainers send most): a tools lookup by default, or
    ``options["step"]``, a whole step body (e.g. a textgame step or a python ``pass``)."""

    id, name, title, unit = "call", "call", "one light step", "call"
    rate_unit = "calls/s"
    throughput_key, seed_base = "calls_per_sec", 0xCA11
    listed = False
    runners = ("tools",)
    DEFAULT: ClassVar[dict[str, Any]] = {
        "runner": "tools",
        "action": {"tool": "get_product_details", "args": {"product_id": "P1001"}},
    }

    async def begin(self, loop: Loop) -> None:
        """``options["session"]``: each loop steps one session of that kind (session steps, not one-shots)."""
        if kind := loop.options.get("session"):
            status, info = await loop.conn.request("POST", "/sessions", {"runner": kind})
            if status != 201:
                raise ValueError(f"creating a {kind} session: {status} {info}")
            loop.state["session_id"] = info["session_id"]
            if first := loop.options.get("first"):  # e.g. a game's reset, before its steps
                status, result = await loop.conn.request(
                    "POST", "/rollout/step", {**first, "session_id": info["session_id"]}
                )
                if status != 200:
                    raise ValueError(f"first step of a {kind} session: {status} {result}")

    async def end(self, loop: Loop) -> None:
        if sid := loop.state.get("session_id"):
            await loop.conn.request("DELETE", f"/sessions/{sid}")

    async def op(self, loop: Loop) -> OpResult:
        body = loop.options.get("step") or self.DEFAULT
        if sid := loop.state.get("session_id"):
            body = {**body, "session_id": sid}
        status, result = await loop.conn.request("POST", "/rollout/step", body)
        if status != 200:
            return http_failure(status, result)
        return OpResult(passed=result.get("ok"))


class LightCallBaseline(Workload):
    """The same light call on the suite's worker replica: ``GET /product/{id}``."""

    id, name, title, unit = "call-baseline", "call-baseline", "one light call (suite's worker)", "call"
    rate_unit = "calls/s"
    throughput_key, seed_base = "calls_per_sec", 0xCA11
    listed = False

    async def op(self, loop: Loop) -> OpResult:
        status, result = await loop.conn.request("GET", f"/product/{loop.rng.randrange(200)}")
        return http_failure(status, result) if status != 200 else OpResult(passed=True)


class SQLExec(Workload):
    """B5: one TPC-H query (Q1-Q22, uniformly drawn) per op on the node's shared data; per-query channels."""

    id, name, title, unit = "B5", "sqlexec", "SQLExec", "query"
    rate_unit = "queries/s"
    runners = ("sql",)
    throughput_key, seed_base = "queries_per_sec", 0xB5

    async def op(self, loop: Loop) -> OpResult:
        n = loop.rng.randint(1, 22)
        status, result = await step(loop, {"runner": "sql", "action": {"tpch": n}, "timeout_s": 60})
        channel = f"Q{n:02d}"
        if status != 200:
            return http_failure(status, result, channel=channel)
        return OpResult(passed=bool(result["ok"]), channel=channel)

    def throughput(self, s: Samples, duration_s: float) -> dict[str, Any]:
        return {self.throughput_key: round(s.ops / duration_s, 3), "total_queries": s.ops}

    def extra(self, s: Samples) -> dict[str, Any]:
        return {
            "queries": 22,
            "pass_rate": s.pass_rate,
            "per_query_latency_ms": {k: summary(v) for k, v in sorted(s.channels.items())},
            "scale_factor_note": "the node's SANDBOXD_SQL__SCALE_FACTOR; embedded: smoke 0.01, quick 0.1, full 1",
        }


class TextGame(Workload):
    """B7: one op = a batch of 10 episodes of 30-50 steps, played server-side by the scripted agent."""

    id, name, title, unit = "B7", "textgame", "Sim-TextGame", "episode"
    rate_unit = "episodes/s"
    runners = ("textgame",)
    throughput_key, seed_base = "episodes_per_sec", 0xB7
    batch = 10

    async def op(self, loop: Loop) -> OpResult:
        steps = loop.rng.randint(30, 50)
        action = {"op": "episodes", "seed": loop.rng.randrange(2**30), "steps": steps, "batch": self.batch}
        status, result = await step(loop, {"runner": "textgame", "action": action})
        if status != 200:
            return http_failure(status, result, units=0)
        obs = result["observation"]
        return OpResult(units=obs["episodes"], steps=obs["steps_done"], reward=obs["total_reward"])

    def throughput(self, s: Samples, duration_s: float) -> dict[str, Any]:
        return {
            self.throughput_key: round(s.units / duration_s, 3),
            "steps_per_sec": round(s.steps / duration_s, 1),
            "requests_per_sec": round(s.ops / duration_s, 3),
            "total_episodes": s.units,
            "total_steps": s.steps,
        }

    def extra(self, s: Samples) -> dict[str, Any]:
        return {
            "episode_steps_range": [30, 50],
            "episodes_per_request": self.batch,
            "avg_steps_per_episode": round(s.steps / s.units, 2) if s.units else None,
            "avg_reward_per_episode": round(s.reward / s.units, 4) if s.units else None,
            "world_rooms": 8,
            "world_items": 30,
            "goal_templates": 6,
        }


class Browser(Workload):
    """B4: one op = one whole trajectory of browser actions in a fresh context (a one-shot step)."""

    id, name, title, unit = "B4", "browser", "Browser", "trajectory"
    rate_unit = "traj/s"
    throughput_key, seed_base = "trajectories_per_sec", 0xB4
    runners: ClassVar[tuple[str, ...]] = ("browser",)
    min_duration_s = 12.0
    seed = 42

    def setup(self, options: dict[str, Any]) -> list[tuple[str, list[dict[str, Any]]]]:
        from sandboxd.bench.browser_trajectories import build_pool

        return build_pool(int(options.get("b4_seed", self.seed)))

    async def op(self, loop: Loop) -> OpResult:
        name, actions = loop.shared[loop.rng.randrange(len(loop.shared))]
        status, result = await step(loop, {"runner": "browser", "action": {"actions": actions}, "timeout_s": 120})
        if status != 200:
            return http_failure(status, result, channel=name)
        obs = result["observation"]
        return OpResult(channel=name, steps=len(obs["results"]), misses=obs["actions_failed"])

    def throughput(self, s: Samples, duration_s: float) -> dict[str, Any]:
        return {
            self.throughput_key: round(s.ops / duration_s, 3),
            "actions_per_sec": round(s.steps / duration_s, 2),
            "total_trajectories": s.ops,
            "total_actions": s.steps,
        }

    def extra(self, s: Samples) -> dict[str, Any]:
        from sandboxd.bench.browser_trajectories import TEMPLATES

        return {
            **pool_breakdown(self.setup({}), TEMPLATES, self.seed, "avg_actions"),
            "selector_miss_rate": round(s.misses / s.steps, 4) if s.steps else None,
            "steps_done_total": s.steps - s.misses,
            "steps_failed_total": s.misses,
            # A trajectory the node failed (an action it starved twice, a queue deadline): its own column.
            "infra_failed_trajectories": s.errors_by_blame.get("infra", 0),
            "failures_by_blame": dict(s.errors_by_blame),
            "per_template_latency_ms": {k: summary(v) for k, v in sorted(s.channels.items())},
            "note": "warm-up ops are not counted (the public suite counts them); each trajectory runs in a "
            "fresh browser context (the suite reuses pooled contexts and keeps their localStorage)",
        }


class BrowserBaseline(Browser):
    """B4's trajectories against a replica of the public suite's worker (``baselines/b4_worker.py``).

    Same pool, same RNG draws, the suite's request shape and its client habit: a new connection
    per request (``Connection: close``). ``options["site_url"]`` is the static server of the shop.
    """

    id, name, title = "B4-baseline", "browser_suite_worker", "Browser via the suite's worker"
    listed = False
    runners = ()

    async def op(self, loop: Loop) -> OpResult:
        name, actions = loop.shared[loop.rng.randrange(len(loop.shared))]
        steps = [{"action": a["action"], "args": {k: v for k, v in a.items() if k != "action"}} for a in actions]
        try:
            status, result = await loop.conn.request(
                "POST", "/task", {"target_url": loop.options["site_url"], "steps": steps}
            )
        finally:
            await loop.conn.close()
        if status != 200:
            return OpResult(error=f"HTTP {status}: {str(result)[:200]}", channel=name, status=status)
        return OpResult(channel=name, steps=result["actions"], misses=result["steps_failed"])


class ConcurrentMixed(Workload):
    """B9: one op = a rollout of U{10..30} sequential sub-operations, each a whole unit of B3/B1/B5/B4/B7.

    Drawn as the public suite does (cumulative weights over ``rng.random()``;
    B3 and B4 from pools built with seeds 93 and 94; B5's query uniform over
    1..22). The first failed sub-operation (a non-2xx answer) fails the
    rollout, whose partial channels are dropped; a program's own failure (a
    snippet that does not pass) does not. Every step carries the rollout's id.
    """

    id, name, title, unit = "B9", "concurrent", "Concurrent-Rollout", "rollout"
    rate_unit = "rollouts/s"
    runners = ("browser", "python", "sql", "textgame", "tools")
    throughput_key, seed_base = "rollouts_per_sec", 0xB9
    min_duration_s = 20.0
    MIX: ClassVar[tuple[tuple[str, float], ...]] = (("B3", 0.5), ("B1", 0.2), ("B5", 0.1), ("B4", 0.1), ("B7", 0.1))
    LENGTH: ClassVar[tuple[int, int]] = (10, 30)
    SEEDS: ClassVar[dict[str, int]] = {"B3": 93, "B4": 94}

    def setup(self, options: dict[str, Any]) -> dict[str, Any]:
        from sandboxd.bench.browser_trajectories import build_pool as browser_pool
        from sandboxd.bench.trajectories import build_pool as tools_pool

        return {
            "B1": WORKLOADS["B1"].setup(options),
            "B3": tools_pool(self.SEEDS["B3"]),
            "B4": browser_pool(self.SEEDS["B4"]),
            "B5": None,
            "B7": None,
        }

    @classmethod
    def draw(cls, rng: random.Random) -> list[str]:
        """One rollout's sub-operations, in order."""
        total = sum(w for _, w in cls.MIX)
        out = []
        bounds = list(itertools.accumulate(w for _, w in cls.MIX))
        for _ in range(rng.randint(*cls.LENGTH)):
            x = rng.random() * total
            out.append(next((t for (t, _), b in zip(cls.MIX, bounds, strict=True) if x < b), cls.MIX[-1][0]))
        return out

    async def op(self, loop: Loop) -> OpResult:
        tasks = self.draw(loop.rng)
        loop.state["rollout_id"] = f"b9-{os.getpid()}-{loop.index}-{loop.rng.getrandbits(48):x}"
        subs: list[tuple[str, float]] = []
        try:
            for task in tasks:
                sub = Loop(loop.conn, loop.rng, loop.shared[task], loop.options, loop.index, loop.state, loop.target)
                t = asyncio.get_running_loop().time()
                res = await WORKLOADS[task].op(sub)
                if res.error:
                    return OpResult(error=f"{task}: {res.error}", blame=res.blame, status=res.status)
                subs.append((task, (asyncio.get_running_loop().time() - t) * 1000))
        finally:
            del loop.state["rollout_id"]
        return OpResult(steps=len(tasks), subs=tuple(subs))

    def throughput(self, s: Samples, duration_s: float) -> dict[str, Any]:
        return {
            self.throughput_key: round(s.ops / duration_s, 3),
            "steps_per_sec": round(s.steps / duration_s, 2),
            "total_rollouts": s.ops,
            "total_steps": s.steps,
        }

    def latency(self, s: Samples) -> dict[str, Any]:
        rollout = summary(s.latencies_ms, s.errors)
        per_task = {t: {"ops": len(s.channels.get(t, [])), **summary(s.channels.get(t, []))} for t, _ in self.MIX}
        return {**rollout, "rollout": rollout, "per_task": per_task}

    def extra(self, s: Samples) -> dict[str, Any]:
        return {
            "task_mix": dict(self.MIX),
            "episode_steps_range": list(self.LENGTH),
            "avg_steps_per_rollout": round(s.steps / (s.ops - s.errors), 2) if s.ops > s.errors else None,
            "ops_breakdown": {t: len(s.channels.get(t, [])) for t, _ in self.MIX},
            "failures_by_blame": dict(s.errors_by_blame),
            "pool_seeds": self.SEEDS,
        }


class ColdStart(Workload):
    """B8: a fresh isolated sandbox running ``print(1)``; N trials, not a time window (``coldstart.py``)."""

    id, name, title, unit = "B8", "coldstart", "ColdStart", "start"
    rate_unit = "starts/s"
    runners = ("python",)
    throughput_key, seed_base = "container_starts_per_sec", 0xB8
    mode = "trials"


WORKLOADS: dict[str, Workload] = {
    w.id: w
    for w in (
        CodeExec(),
        ToolCall(),
        ToolCallBaseline(),
        LightCall(),
        LightCallBaseline(),
        Browser(),
        BrowserBaseline(),
        SQLExec(),
        TextGame(),
        ColdStart(),
        ConcurrentMixed(),
        CodeExecSession(),
        CodeExecFusion(),
        CppFusion(),
        CodeExecBaseline(),
    )
}


def listed() -> list[str]:
    """The ids ``sandboxd bench`` offers, in registry order."""
    return [k for k, w in WORKLOADS.items() if w.listed]


def real_python() -> str:
    """The interpreter running this process, resolved past any pyenv shim (~100 ms per start)."""
    import sys

    return os.path.realpath(sys.executable)
