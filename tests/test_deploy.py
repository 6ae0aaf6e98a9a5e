"""The Helm chart rendered by a real helm and validated against the Kubernetes API schemas; the Dockerfile's
build step run as the image runs it.

helm comes from scripts/install_helm.py (the official binary, offline); kubernetes-validate carries the
Kubernetes API's JSON schemas. ServiceMonitor is a CRD neither knows: it is checked against the Service
it must select.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from sandboxd.cli import build_parser
from sandboxd.config import settings_model

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "helm" / "sandboxd"
HELM = shutil.which("helm", path=str(Path(sys.executable).parent)) or shutil.which("helm")
KEY = "0123456789abcdef-test-key"
K8S_VERSIONS = ("1.30.0", "1.37.0")

needs_helm = pytest.mark.skipif(HELM is None, reason="no helm binary (scripts/install_helm.py is x86_64 only)")


class StrictLoader(yaml.SafeLoader):
    """YAML with duplicate keys refused: Kubernetes would silently keep one of them."""


def _no_duplicates(loader: StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    keys = [loader.construct_object(k, deep=deep) for k, _ in node.value]
    dup = {k for k in keys if keys.count(k) > 1}
    if dup:
        raise AssertionError(f"duplicate keys {dup} at {node.start_mark}")
    return loader.construct_mapping(node, deep=deep)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    assert HELM is not None
    return subprocess.run([HELM, *args], capture_output=True, text=True, timeout=60, env={"HOME": "/tmp", "PATH": ""})


def render(*values: str) -> list[dict[str, Any]]:
    r = helm("template", "rel", str(CHART), "--namespace", "rl", "--set-json", f'apiKeys.keys=["{KEY}"]', *values)
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.load_all(r.stdout, Loader=StrictLoader) if d]


def by_kind(docs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for d in docs:
        out.setdefault(d["kind"], []).append(d)
    return out


MODES = {
    "default": (),
    "external-redis-autoscaled-monitored": (
        "--set",
        "redis.bundled=false",
        "--set",
        "redis.url=redis://redis.infra:6379/0",
        "--set",
        "autoscaling.enabled=true",
        "--set",
        "autoscaling.queueDepth.enabled=true",
        "--set",
        "serviceMonitor.enabled=true",
        "--set",
        "security.mode=capabilities",
        "--set",
        "drain.waitForSessions=true",
    ),
    "graviton": ("-f", str(CHART / "examples" / "graviton.yaml")),
    "e2b-by-domain": (
        *("--set", "e2bIngress.enabled=true", "--set", "e2bIngress.domain=sandboxes.example.com"),
        *("--set", "e2bIngress.tls.secretName=wildcard-tls", "--set", "e2bIngress.className=nginx"),
    ),
    "gpu-spare-cpus": ("-f", str(CHART / "examples" / "gpu-spare-cpus.yaml")),
    "container-images": (
        *("--set", "images.enabled=true", "--set", "images.registrySecret=regcred"),
        *("--set-json", 'images.pull=["registry.example.com/team/task:1","ghcr.io/x/y:2"]'),
        *("--set", 'config.RUNNERS=["python"\\,"container"]'),
    ),
}


# Instance types the examples name: vCPUs, GiB, and the pods EKS's VPC CNI allows (its max-pods table).
INSTANCES = {"m8g.4xlarge": (16, 64, 234), "m7i.4xlarge": (16, 64, 234), "c8g.4xlarge": (16, 32, 234)}
# What the usual DaemonSets of a node ask (VPC CNI 25m, kube-proxy 100m, EBS CSI node 10m; ~400 MiB in all).
DAEMONSETS_CPU_M, DAEMONSETS_MEM_MI = 150, 400


def allocatable(instance: str) -> tuple[int, int]:
    """(millicores, MiB) a pod may request on ``instance``: EKS's kubelet reserve (CPU: 6% of the first core, 1%
    of the second, 0.5% of the next two, 0.25% of the rest; memory: 255 MiB + 11 MiB per pod, and the 100 MiB
    eviction threshold), less the usual DaemonSets'."""
    vcpus, gib, max_pods = INSTANCES[instance]
    cores = [60, 10, 5, 5] + [2.5] * (vcpus - 4)
    cpu = vcpus * 1000 - sum(cores[:vcpus]) - DAEMONSETS_CPU_M
    mem = gib * 1024 - (255 + 11 * max_pods) - 100 - DAEMONSETS_MEM_MI
    return int(cpu), mem


def _quantity_m(value: str) -> int:
    return int(value[:-1]) if value.endswith("m") else int(float(value) * 1000)


def _quantity_mi(value: str) -> int:
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024}
    return int(float(value[:-2]) * units[value[-2:]]) if value[-2:] in units else int(value) // (1 << 20)


@needs_helm
@pytest.mark.parametrize(
    "example",  # those that name the instance type they run on (the others take a share of any node)
    sorted(p.name for p in (CHART / "examples").glob("*.yaml") if "node.kubernetes.io/instance-type" in p.read_text()),
)
def test_every_example_fits_the_node_it_names(example: str) -> None:
    """A schema cannot see it: the Graviton example asked a Guaranteed 16 CPUs of an m8g.4xlarge, whose
    allocatable is below 16, and stayed Pending. Each example naming an instance type fits it, with room for the
    kubelet's reserve and the usual DaemonSets."""
    docs = render("-f", str(CHART / "examples" / example))
    kinds = by_kind(docs)
    pod = (kinds.get("StatefulSet") or kinds["DaemonSet"])[0]["spec"]["template"]["spec"]
    instance = pod["nodeSelector"]["node.kubernetes.io/instance-type"]
    containers = pod["containers"] + pod.get("initContainers", [])
    cpu = sum(_quantity_m(c["resources"]["requests"]["cpu"]) for c in pod["containers"])
    mem = sum(_quantity_mi(c["resources"]["requests"]["memory"]) for c in pod["containers"])
    cpu = max(cpu, *(_quantity_m(c["resources"]["requests"]["cpu"]) for c in containers))
    room_cpu, room_mem = allocatable(instance)
    assert cpu <= room_cpu, f"{example}: {cpu}m of CPU asked, {room_cpu}m allocatable on {instance}"
    assert mem <= room_mem, f"{example}: {mem} MiB asked, {room_mem} MiB allocatable on {instance}"


@needs_helm
def test_lint_strict() -> None:
    r = helm("lint", "--strict", str(CHART), "--set-json", f'apiKeys.keys=["{KEY}"]')
    assert r.returncode == 0, r.stdout + r.stderr


@needs_helm
@pytest.mark.parametrize("mode", list(MODES))
def test_rendered_manifests_are_valid_kubernetes(mode: str) -> None:
    docs = render(*MODES[mode])
    for doc in docs:
        if doc["kind"] == "ServiceMonitor":
            continue
        for version in K8S_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                raise AssertionError(f"{doc['kind']}/{doc['metadata']['name']} on {version}: {exc}") from None
    kinds = by_kind(docs)
    workload = (kinds.get("StatefulSet") or kinds["DaemonSet"])[0]
    pod = workload["spec"]["template"]
    node_services = [s for s in kinds["Service"] if s["spec"]["selector"].get("app.kubernetes.io/component") == "node"]
    pod_labels = pod["metadata"]["labels"]
    for svc in node_services:  # every Service selects the node pods and only them
        assert all(pod_labels.get(k) == v for k, v in svc["spec"]["selector"].items())
    for redis in kinds.get("Deployment", []):
        labels = redis["spec"]["template"]["metadata"]["labels"]
        assert not all(labels.get(k) == v for k, v in node_services[0]["spec"]["selector"].items())
    if "PodDisruptionBudget" in kinds:
        sel = kinds["PodDisruptionBudget"][0]["spec"]["selector"]["matchLabels"]
        assert all(pod_labels.get(k) == v for k, v in sel.items())
    if "HorizontalPodAutoscaler" in kinds:
        ref = kinds["HorizontalPodAutoscaler"][0]["spec"]["scaleTargetRef"]
        assert (ref["kind"], ref["name"]) == (workload["kind"], workload["metadata"]["name"])
        assert "replicas" not in workload["spec"]  # the HPA owns it
    for ingress in kinds.get("Ingress", []):  # E2B's addressing: every name under the domain, to the nodes
        (rule,) = ingress["spec"]["rules"]
        assert rule["host"] == "*.sandboxes.example.com" and ingress["spec"]["tls"][0]["hosts"] == [rule["host"]]
        backend = rule["http"]["paths"][0]["backend"]["service"]
        (svc,) = [s for s in node_services if s["metadata"]["name"] == backend["name"]]
        assert "clusterIP" not in svc["spec"] and backend["port"]["name"] in {p["name"] for p in svc["spec"]["ports"]}
    assert ("Ingress" in kinds) == (mode == "e2b-by-domain")
    spec = pod["spec"]
    (node,) = spec["containers"]
    mounts = {m["name"]: m["mountPath"] for m in node["volumeMounts"]}
    if mode == "container-images":  # the store a volume, its images pulled before the node starts
        (init,) = spec["initContainers"]
        assert init["command"][-2:] == ["registry.example.com/team/task:1", "ghcr.io/x/y:2"]
        for c in (init, node):
            env = {e["name"]: e.get("value") for e in c["env"]}
            assert env["SANDBOXD_IMAGES_DIR"] == "/var/lib/sandboxd/images/store"
            assert env["REGISTRY_AUTH_FILE"] == "/etc/sandboxd/registry/config.json"
            assert {m["name"]: m["mountPath"] for m in c["volumeMounts"]}["images"] == "/var/lib/sandboxd/images"
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes["registry-auth"]["secret"]["secretName"] == "regcred" and "emptyDir" in volumes["images"]
    else:
        assert "initContainers" not in spec and "images" not in mounts
    for monitor in kinds.get("ServiceMonitor", []):
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        wanted = monitor["spec"]["selector"]["matchLabels"]
        selected = [s for s in kinds["Service"] if all(s["metadata"]["labels"].get(k) == v for k, v in wanted.items())]
        assert [s["metadata"]["name"] for s in selected] == ["rel-sandboxd-nodes"]  # each node scraped once
        ports = {p["name"] for p in selected[0]["spec"]["ports"]}
        assert all(e["port"] in ports and e["path"] == "/metrics" for e in monitor["spec"]["endpoints"])


@needs_helm
@pytest.mark.parametrize("mode", list(MODES))
def test_the_pod_starts_a_node_the_settings_accept(mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the pod would run: its SANDBOXD_* settings load, its preStop parses, its grace covers the drain."""
    kinds = by_kind(render(*MODES[mode]))
    workload = (kinds.get("StatefulSet") or kinds["DaemonSet"])[0]
    spec = workload["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    fake = {"POD_NAME": "rel-sandboxd-0", "POD_NAMESPACE": "rl", "POD_IP": "10.0.0.7", "K8S_NODE_NAME": "gpu-node-3"}
    env = {}
    for e in container["env"]:
        if "value" in e:
            env[e["name"]] = re.sub(r"\$\((\w+)\)", lambda m: fake[m.group(1)], e["value"])
    (configmap,) = kinds["ConfigMap"]
    env.update(configmap["data"])
    keys = tmp_path / "keys"
    secret = kinds["Secret"][0]["stringData"]
    keys.write_text(next(iter(secret.values())))
    env["SANDBOXD_API_KEYS_FILE"] = str(keys)
    for name, value in env.items():  # read as the node reads them: from its environment
        if name.startswith("SANDBOXD_"):
            monkeypatch.setenv(name, value)
    settings = settings_model()()
    assert settings.all_api_keys() == [KEY]
    assert settings.redis_url and settings.advertised_url().startswith("http://")
    if workload["kind"] == "StatefulSet":
        assert settings.node_id == "rel-sandboxd-0"
        assert f".{workload['spec']['serviceName']}.rl.svc:" in settings.node_url
    else:
        assert settings.node_id == "gpu-node-3" and settings.node_url == "http://10.0.0.7:8080"
    res = container["resources"]
    assert res["requests"] == res["limits"] and str(settings.workers) == str(res["limits"]["cpu"])
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sandboxd"
    args = build_parser().parse_args(pre_stop[1:])
    assert args.func.__name__ == "_drain" and args.url.startswith("http://127.0.0.1:")
    assert spec["terminationGracePeriodSeconds"] >= args.timeout + settings.shutdown_grace_s
    probes = {name: container[name]["httpGet"]["path"] for name in ("startupProbe", "readinessProbe", "livenessProbe")}
    assert probes == {"startupProbe": "/healthz", "readinessProbe": "/readyz", "livenessProbe": "/healthz"}
    assert not settings.auth_ops  # the probes send no key
    sc = container["securityContext"]
    assert sc["runAsUser"] == 0 and (sc.get("privileged") or "SYS_ADMIN" in sc["capabilities"]["add"])


@needs_helm
@pytest.mark.parametrize(
    ("values", "message"),
    [
        (("--set", "vcpus=0"), "vcpus"),
        (("--set", "mode=deployment"), "mode"),
        (("--set", "config.NODE_URL=http://x:1"), "NODE_URL"),
        (("--set", "redis.url=http://redis:6379"), "redis"),
        (("--set-json", 'apiKeys.keys=["short"]'), "apiKeys"),
        (("--set", "serviceMonitor.interval=often"), "interval"),
        (("--set", "unknownValue=1"), "unknownValue"),
    ],
)
def test_values_schema_refuses_bad_values(values: tuple[str, ...], message: str) -> None:
    r = helm("template", "rel", str(CHART), "--set-json", f'apiKeys.keys=["{KEY}"]', *values)
    assert r.returncode != 0 and message in r.stderr, r.stderr


@needs_helm
def test_required_values_are_named() -> None:
    r = helm("template", "rel", str(CHART))
    assert r.returncode != 0 and "apiKeys.keys or apiKeys.existingSecret" in r.stderr
    r = helm("template", "rel", str(CHART), "--set-json", f'apiKeys.keys=["{KEY}"]', "--set", "redis.bundled=false")
    assert r.returncode != 0 and "redis.url is required" in r.stderr


def test_values_schema_is_valid_json_schema() -> None:
    import jsonschema  # type: ignore[import-untyped]

    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.validate(yaml.safe_load((CHART / "values.yaml").read_text()) | {"apiKeys": {"keys": [KEY]}}, schema)


def test_the_installs_take_the_pinned_tree_and_it_satisfies_the_ranges() -> None:
    """setup.sh and the image install at constraints.txt's versions (a fresh resolve against that day's PyPI once
    ended in resolution-too-deep), and every requirement the project names is pinned inside its own range."""
    import tomllib

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    assert "-c constraints.txt" in (ROOT / "scripts" / "setup.sh").read_text()
    assert "-c constraints.txt" in (ROOT / "Dockerfile").read_text()
    pins: dict[str, str] = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, line
            pins[canonicalize_name(name)] = version
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [*project["dependencies"], *(r for extra in project["optional-dependencies"].values() for r in extra)]
    for raw in reqs:
        req = Requirement(raw)
        if req.name == "sandboxd":
            continue
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is not pinned in constraints.txt"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"{req.name}=={pins[name]} is outside {req.specifier}"
        )


def test_dockerfile_installs_what_setup_installs_and_builds_a_complete_wheel(tmp_path: Path) -> None:
    """The image's Debian packages are the node's (setup.sh), and its build step (pip wheel .) makes a wheel
    that carries everything the node reads from its package (jailside code, bench data, the shop site)."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    debian = re.search(r"ARG DEBIAN=(\w+)", dockerfile).group(1)  # type: ignore[union-attr]

    def printed(*args: str) -> set[str]:  # setup.sh's own list, for the image's Debian release
        out = subprocess.run(
            ["bash", str(ROOT / "scripts" / "setup.sh"), *args, "--print-packages"],
            capture_output=True,
            text=True,
            timeout=30,
            env={**os.environ, "SANDBOXD_DEBIAN": debian},
        )
        assert out.returncode == 0, out.stderr
        return set(out.stdout.split())

    node_pkgs = printed() - {"npm"}  # npm: the image installs it for one step and removes it
    assert printed("--test") - printed() == {
        "redis-server",
        "seccomp",
        "docker-registry",
    }  # only the tests start or read these
    image_pkgs = set(re.search(r"--no-install-recommends ([^\\\n]+)", dockerfile).group(1).split())  # type: ignore[union-attr]
    # The JDK is the release's own (the image's case, as setup.sh's): bookworm's 17, any later one's 21.
    old_jdk, new_jdk = re.search(r"bookworm \| bullseye\) jdk=(\S+) ;; \*\) jdk=(\S+) ;;", dockerfile).groups()  # type: ignore[union-attr]
    image_pkgs = (image_pkgs - {'"$jdk"'}) | {old_jdk if debian in ("bookworm", "bullseye") else new_jdk}
    assert node_pkgs <= image_pkgs, node_pkgs - image_pkgs
    trixie = subprocess.run(
        ["bash", str(ROOT / "scripts" / "setup.sh"), "--print-packages"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "SANDBOXD_DEBIAN": "trixie"},
    )
    assert new_jdk in trixie.stdout.split() and old_jdk not in trixie.stdout.split(), trixie.stdout
    assert '"/usr/bin/tini", "--"' in dockerfile and '"-g"' not in dockerfile  # a stop's SIGTERM: the node alone
    assert dockerfile.count("\nFROM ") + dockerfile.startswith("FROM ") >= 2  # multi-stage
    assert 'CMD ["sandboxd", "serve"]' in dockerfile
    assert '"sandboxd[server]"' in dockerfile and '".[server]"' in dockerfile  # the node's extras, not the SDK alone
    src = tmp_path / "src"  # exactly what the build stage copies
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "constraints.txt"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "sandboxd", src / "sandboxd", ignore=shutil.ignore_patterns("__pycache__"))
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    (wheel,) = tmp_path.glob("sandboxd-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in (
        "sandboxd/py.typed",
        "sandboxd/runners/jail/jailside/zygote.py",
        "sandboxd/bench/data/prices.json",
        "sandboxd/runners/browser/sites/shop/index.html",
        "sandboxd/cluster/service.py",
    ):
        assert needed in names, needed
    # What a tenant's program must not find in the image: the tests and the repository's tooling.
    assert not any(n.startswith("tests/") for n in names)


def test_the_client_sdk_installs_and_imports_without_the_server() -> None:
    """A trainer installs ``sandboxd`` (the SDK: httpx only) and ``sandboxd[gym]``; the node is ``sandboxd[server]``.
    The SDK's modules load nothing of the server (no FastAPI, nsjail, DuckDB, Playwright, Redis...)."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert [re.split(r"[<>=\[ ]", d)[0] for d in project["dependencies"]] == ["httpx"]
    assert "sandboxd[server,gym]" in project["optional-dependencies"]["dev"]
    code = (
        "import sys, sandboxd, sandboxd.client, sandboxd.gym\n"
        "server = {'fastapi', 'starlette', 'uvicorn', 'gunicorn', 'pydantic', 'pydantic_settings', 'orjson', 'nsjail',"
        " 'duckdb', 'playwright', 'redis', 'mcp', 'aiobotocore', 'prometheus_client'}\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & server))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.strip() == "[]", (r.stdout, r.stderr)
    assert (ROOT / "sandboxd" / "py.typed").exists()
    # Its command line says what it needs rather than dying of an import (the server's modules are absent).
    blocked = "import sys\nfor m in ('orjson', 'pydantic', 'fastapi'):\n    sys.modules[m] = None\n"
    for argv in ("['--help']", "['bench', '--help']", "['doctor']"):
        cli = blocked + f"from sandboxd.cli import main\nsys.exit(main({argv}))"
        r = subprocess.run([sys.executable, "-c", cli], capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert r.returncode == 1 and "pip install 'sandboxd[server]'" in r.stderr, (argv, r.stdout, r.stderr)
        assert "Traceback" not in r.stderr, r.stderr


def test_vm_test_plans_each_platform_and_refuses_what_it_cannot_boot() -> None:
    """scripts/vm-test.sh (a cgroup v2 guest under QEMU: far too slow for this suite) says what it would build and
    run; the default subset covers python fork only where the kernel has it (6.12), and a platform it does not
    know is a usage error, before anything is installed."""
    script = ROOT / "scripts" / "vm-test.sh"

    def plan(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(script), *args], capture_output=True, text=True, timeout=60, cwd=ROOT)

    new, old = plan("--plan"), plan("--plan", "--arch", "arm64", "--kernel", "6.1")
    assert new.returncode == 0 and old.returncode == 0, new.stderr + old.stderr
    assert "trixie, linux-image-amd64)" in new.stdout and "qemu-system-x86_64" in new.stdout
    assert "linux-image-arm64/bookworm" in old.stdout and "qemu-system-aarch64" in old.stdout
    assert (
        "tests: -m vm tests/\n" in new.stdout and "tests: -m vm tests/ --ignore=tests/test_python_fork.py" in old.stdout
    )
    # The `vm` subset reaches every area the guest must cover, and is large enough to say something (N >= 30).
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "vm", "-p", "no:cacheprovider", "tests/"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    chosen = [line for line in r.stdout.splitlines() if "::" in line]
    areas = {"test_python_api", "test_pressure", "test_python_fork", "test_sql", "test_browser", "test_fronts"}
    areas |= {"test_container"}
    assert {c.split("::")[0].removeprefix("tests/").removesuffix(".py") for c in chosen} >= areas, chosen
    assert {c for c in chosen if c.startswith("tests/test_code.py")} == {
        f"tests/test_code.py::{t}[cpp]"
        for t in ("test_hello_stdin_and_failures", "test_time_limit", "test_memory_limit")
    }
    assert len([c for c in chosen if "test_python_fork" not in c]) >= 30, chosen
    assert new.stdout.split("image: ")[1].split()[0] != old.stdout.split("image: ")[1].split()[0]
    smoke = plan("--plan", "--arch", "arm64", "--tests", "smoke")
    assert smoke.returncode == 0 and "tests: smoke" in smoke.stdout, smoke.stderr
    for bad in (("--arch", "riscv64"), ("--kernel", "5.10"), ("--frobnicate",), ("--tests", " ")):
        r = plan(*bad)
        assert r.returncode == 2 and r.stderr, (bad, r.stderr)
    vm = ROOT / "scripts" / "vm"
    for shell in (script, vm / "guest.sh", vm / "image.sh", ROOT / "scripts" / "check-wheels.sh"):
        r = subprocess.run(["bash", "-n", str(shell)], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, (shell, r.stderr)


def test_setup_without_home_or_a_new_enough_python_says_so_before_installing_anything(tmp_path: Path) -> None:
    """A systemd unit or a bare container has no HOME, and bookworm has Python 3.11: setup.sh says what is
    missing at once (it used to fail on HOME under set -u, and would have installed ~500 Debian packages
    before finding no Python). Its PATH here has the few tools it needs and no Python at all."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("dirname", "ls", "sort", "bash"):
        found = shutil.which(tool)
        assert found is not None
        (bin_dir / tool).symlink_to(found)
    t0 = time.monotonic()
    r = subprocess.run(
        ["bash", str(ROOT / "scripts" / "setup.sh")],
        env={"PATH": str(bin_dir)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1 and "no Python >= 3.12 here" in r.stderr, (r.stdout, r.stderr)
    assert "installing" not in r.stdout and time.monotonic() - t0 < 10, r.stdout
