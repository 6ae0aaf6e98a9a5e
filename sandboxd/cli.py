"""``sandboxd`` command line: thin, parses and delegates; named exit codes.

sandboxd serve            run a node (gateway + workers) on this machine
sandboxd demo             serve on loopback, run real programs and a short load against it, stop
sandboxd smoke --target   run real programs against a running node and print what happened
sandboxd config-docs      print the configuration reference (docs/configuration.md)
sandboxd doctor           check what the Python runner needs (nsjail, cgroups, interpreter)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NOT_READY = 3


def _serve(args: argparse.Namespace) -> int:
    import uvicorn
    from pydantic import ValidationError

    from sandboxd.app import create_app
    from sandboxd.config import load_settings

    overrides: dict[str, object] = {}
    for name in ("host", "port", "workers"):
        value = getattr(args, name)
        if value is not None:
            overrides[name] = value
    if args.runners:
        overrides["runners"] = args.runners.split(",")
    try:
        settings = load_settings(**overrides)
    except ValidationError as exc:
        print(f"sandboxd serve: invalid settings:\n{exc}", file=sys.stderr)
        return EXIT_USAGE
    from sandboxd.serving import DrainingServer

    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=False,
        loop="auto",
        http="auto",
        timeout_graceful_shutdown=int(settings.shutdown_grace_s) + 1,
        limit_concurrency=settings.max_connections,
        timeout_keep_alive=30,
    )
    DrainingServer(config, app.state.gateway).run()
    return EXIT_OK


def _smoke(args: argparse.Namespace) -> int:
    from sandboxd.smoke import run_smoke

    return (
        EXIT_OK
        if asyncio.run(run_smoke(args.target, load_s=args.load_s, concurrency=args.concurrency))
        else EXIT_FAILED
    )


def _demo(args: argparse.Namespace) -> int:
    from sandboxd.localnode import NodeDidNotStart, local_node
    from sandboxd.smoke import run_smoke

    print("starting sandboxd on a free loopback port ...", flush=True)
    try:
        with local_node({"SANDBOXD_LOG_LEVEL": os.environ.get("SANDBOXD_LOG_LEVEL", "info")}, inherit=True) as base:
            ok = asyncio.run(run_smoke(base, load_s=args.load_s, concurrency=args.concurrency))
    except NodeDidNotStart as exc:
        print(exc, file=sys.stderr)
        return EXIT_NOT_READY
    return EXIT_OK if ok else EXIT_FAILED


def _config_docs(args: argparse.Namespace) -> int:
    from pathlib import Path

    from sandboxd.configdocs import render

    text = render()
    if args.check:
        path = Path(args.check)
        current = path.read_text() if path.exists() else ""
        if current != text:
            print(f"{args.check} is out of date: run `sandboxd config-docs > {args.check}`", file=sys.stderr)
            return EXIT_FAILED
        return EXIT_OK
    sys.stdout.write(text)
    return EXIT_OK


def _doctor(_: argparse.Namespace) -> int:
    from sandboxd.doctor import run_doctor

    return EXIT_OK if run_doctor() else EXIT_FAILED


def _bench(args: argparse.Namespace) -> int:
    from pathlib import Path

    from sandboxd.bench.run import PRESETS, execute, make_plan

    conc = [int(x) for x in args.concurrency.split(",")] if args.concurrency else None
    try:
        plan = make_plan(
            [w.upper() for w in args.workloads],
            args.preset,
            warmup=args.warmup,
            duration=args.duration,
            cooldown=args.cooldown,
            concurrency=conc,
            b8_trials=args.trials,
        )
    except ValueError as exc:
        print(f"sandboxd bench: {exc} (presets: {', '.join(PRESETS)})", file=sys.stderr)
        return EXIT_USAGE
    execute(plan, args.target, Path(args.out), args.instance_type)
    return EXIT_OK


def _size(args: argparse.Namespace) -> int:
    from pathlib import Path

    from sandboxd.bench.size import print_table, size

    try:
        rows = size([Path(d) for d in args.results], args.workload.upper(), args.target_units_per_s, args.p99_ms)
    except FileNotFoundError as exc:
        print(f"sandboxd size: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print_table(rows, args.target_units_per_s, args.p99_ms, set(args.sizes.split(",")) if args.sizes else None)
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sandboxd", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run a node; settings from SANDBOXD_* (see docs/configuration.md)")
    serve.add_argument("--host", help="SANDBOXD_HOST")
    serve.add_argument("--port", type=int, help="SANDBOXD_PORT")
    serve.add_argument("--workers", type=int, help="SANDBOXD_WORKERS (0 = one per vCPU)")
    serve.add_argument("--runners", help="SANDBOXD_RUNNERS, comma-separated (python,fake)")
    serve.set_defaults(func=_serve)
    for name, func, hlp in (
        ("demo", _demo, "serve on a free loopback port, run real programs and a short load, stop"),
        ("smoke", _smoke, "run real programs against --target and print what happened"),
    ):
        p = sub.add_parser(name, help=hlp)
        if name == "smoke":
            p.add_argument("--target", required=True, help="base URL, e.g. http://127.0.0.1:8080")
        p.add_argument("--load-s", type=float, default=5.0, help="seconds of load after the programs (0 = none)")
        p.add_argument("--concurrency", type=int, default=8, help="concurrent one-shot steps during the load")
        p.set_defaults(func=func)
    from sandboxd.bench.workloads import listed

    bench = sub.add_parser("bench", help=f"replay workloads ({' '.join(listed())}) against a node and report")
    bench.add_argument("workloads", nargs="*", default=[], help=f"{' '.join(listed())} (default: all)")
    bench.add_argument("--target", help="base URL of a running node; default: start one on loopback")
    bench.add_argument("--preset", choices=["smoke", "quick", "full"], default="quick")
    bench.add_argument("--concurrency", help="comma-separated levels, e.g. 1,8,32,128")
    bench.add_argument("--warmup", type=float, help="unmeasured seconds per level")
    bench.add_argument("--duration", type=float, help="measured seconds per level")
    bench.add_argument("--cooldown", type=float, help="idle seconds after each level")
    bench.add_argument("--trials", type=int, help="B8 trials per level")
    bench.add_argument("--out", default="bench-results", help="results directory")
    bench.add_argument("--instance-type", help="what this machine is, e.g. m7i.4xlarge (prices it)")
    bench.set_defaults(func=_bench)
    sz = sub.add_parser("size", help="fleet sizing from sandboxd.bench results (one directory per measured machine)")
    sz.add_argument("--results", nargs="+", required=True, help="results directories, e.g. one per machine")
    sz.add_argument("--workload", default="B1")
    sz.add_argument(
        "--target-units-per-s", "--target-rollouts-per-s", type=float, required=True, dest="target_units_per_s"
    )
    sz.add_argument("--p99-ms", type=float, required=True)
    sz.add_argument("--sizes", help="only these sizes, e.g. 4xlarge,8xlarge")
    sz.set_defaults(func=_size)
    docs = sub.add_parser("config-docs", help="print docs/configuration.md, generated from the settings models")
    docs.add_argument("--check", metavar="FILE", help="exit 1 when FILE differs from what would be generated")
    docs.set_defaults(func=_config_docs)
    doctor = sub.add_parser("doctor", help="check nsjail, cgroups and the jail's interpreter")
    doctor.set_defaults(func=_doctor)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
