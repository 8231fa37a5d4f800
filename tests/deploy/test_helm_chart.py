"""The Helm chart as users rely on it, rendered by the real helm binary (no cluster)."""

from __future__ import annotations

import base64
import importlib.util
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from engram_core.worker_catalog import WORKER_CATALOG, worker_entry

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART = REPO_ROOT / "deploy" / "helm" / "engram"
RELEASE = "engram"
#: A component per worker image (engram_core.worker_catalog); a sidecar worker shares one.
WORKERS = tuple(entry.image for entry in WORKER_CATALOG if not entry.sidecar)
COMPONENTS = ("gateway", "retrieval", *WORKERS)

Obj = dict[str, Any]


def _helm_module() -> Any:
    spec = importlib.util.spec_from_file_location(
        "engram_deploy_helm", REPO_ROOT / "deploy" / "scripts" / "helm.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_helm = _helm_module()


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    return _helm.run_helm(*args)


def _value_args(sets: tuple[str, ...], files: tuple[str, ...]) -> list[str]:
    args: list[str] = []
    for item in sets:
        args += ["--set", item]
    for name in files:
        args += ["--values", str(CHART / "ci" / name)]
    return args


@cache
def _render(sets: tuple[str, ...], files: tuple[str, ...]) -> tuple[Obj, ...]:
    proc = helm("template", RELEASE, str(CHART), *_value_args(sets, files))
    assert proc.returncode == 0, proc.stderr
    return tuple(doc for doc in yaml.safe_load_all(proc.stdout) if doc)


def render(*sets: str, files: tuple[str, ...] = ()) -> list[Obj]:
    """Every object `helm template` renders with these --set values and ci/ files."""
    return list(_render(sets, files))


def render_error(*sets: str) -> str:
    """Render values that must be refused; returns helm's message. Flags pass through."""
    flags = [s for s in sets if s.startswith("--")]
    values = tuple(s for s in sets if not s.startswith("--"))
    proc = helm("template", RELEASE, str(CHART), *flags, *_value_args(values, ()))
    assert proc.returncode != 0, f"rendered although it should fail: {sets}"
    return proc.stderr


def lint_error(*sets: str) -> str:
    proc = helm("lint", "--strict", str(CHART), *_value_args(sets, ()))
    assert proc.returncode != 0, f"linted clean although it should fail: {sets}"
    return proc.stdout + proc.stderr


def of_kind(objects: list[Obj], kind: str) -> list[Obj]:
    return [o for o in objects if o["kind"] == kind]


def named(objects: list[Obj], kind: str, name: str) -> Obj:
    matches = [o for o in of_kind(objects, kind) if o["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name}: {len(matches)} found"
    return matches[0]


def component_of(obj: Obj) -> str:
    """The object's component label; "" where it has none."""
    return obj["metadata"].get("labels", {}).get("app.kubernetes.io/component", "")


def workloads(objects: list[Obj]) -> list[Obj]:
    return [o for o in objects if o["kind"] in ("Deployment", "StatefulSet")]


def containers(workload: Obj) -> list[Obj]:
    return workload["spec"]["template"]["spec"]["containers"]


def env_of(container: Obj) -> dict[str, Obj]:
    return {entry["name"]: entry for entry in container.get("env", [])}


def walk_strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from walk_strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from walk_strings(item)


#: The workers each in a Deployment of its own (the mirror's pod is a StatefulSet).
HEALTH_PORTS = {
    entry.name: entry.health_port
    for entry in WORKER_CATALOG
    if not entry.sidecar and entry.image == entry.name
}


def full(component: str) -> str:
    return f"{RELEASE}-{component}"


# -- workloads and probes ---------------------------------------------------------------


def test_each_component_has_its_own_workload_and_service() -> None:
    objects = render()
    by_component = {component_of(w): w for w in workloads(objects)}
    assert sorted(by_component) == sorted(COMPONENTS)
    assert len(workloads(objects)) == len(COMPONENTS)
    for name, workload in by_component.items():
        assert workload["kind"] == ("StatefulSet" if name == "file-mirror" else "Deployment")
        assert workload["metadata"]["name"] == full(name)
        assert containers(workload)[0]["image"] == f"engram/{name}:0.1.0"
        named(objects, "Service", full(name))


def test_gateway_probes_http_healthz_and_readyz() -> None:
    """Readiness is /readyz (this pod can serve chats), never /readyz/memory: a retrieval
    restart must not take every gateway pod out of service, since chats are answered
    without memory meanwhile."""
    (container,) = containers(named(render(), "Deployment", full("gateway")))
    assert container["ports"] == [{"name": "http", "containerPort": 8100, "protocol": "TCP"}]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": 8100}
    assert container["startupProbe"]["httpGet"] == {"path": "/healthz", "port": 8100}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": 8100}
    for probe in ("livenessProbe", "startupProbe", "readinessProbe"):
        assert "memory" not in container[probe]["httpGet"]["path"]
    env = env_of(container)
    assert env["ENGRAM_GATEWAY_HOST"]["value"] == "0.0.0.0"
    assert env["ENGRAM_GATEWAY_PORT"]["value"] == "8100"


def test_retrieval_probes_are_native_grpc_health_checks() -> None:
    (container,) = containers(named(render(), "Deployment", full("retrieval")))
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["grpc"] == {"port": 50051}
        assert "httpGet" not in container[probe]
    assert env_of(container)["ENGRAM_RETRIEVAL_LISTEN"]["value"] == "0.0.0.0:50051"


def test_retrieval_serves_prometheus_metrics_on_its_own_port_unless_turned_off() -> None:
    objects = render()
    (container,) = containers(named(objects, "Deployment", full("retrieval")))
    assert {"name": "metrics", "containerPort": 9464, "protocol": "TCP"} in container["ports"]
    env = env_of(container)
    assert (env["ENGRAM_METRICS_PORT"]["value"], env["ENGRAM_METRICS_HOST"]["value"]) == (
        "9464",
        "0.0.0.0",
    )
    service = named(objects, "Service", full("retrieval"))
    assert ("metrics", 9464) in [(p["name"], p["port"]) for p in service["spec"]["ports"]]

    off = render("components.retrieval.metricsPort=0")
    (container,) = containers(named(off, "Deployment", full("retrieval")))
    assert "ENGRAM_METRICS_PORT" not in env_of(container)
    assert [p["name"] for p in container["ports"]] == ["grpc"]
    refused = lint_error("components.retrieval.metricsPort=70000")
    assert "retrieval/metricsPort" in refused and "want 65,535" in refused


@pytest.mark.parametrize("worker", sorted(HEALTH_PORTS))
def test_each_worker_probes_its_own_health_port(worker: str) -> None:
    (container,) = containers(named(render(), "Deployment", full(worker)))
    port = HEALTH_PORTS[worker]
    assert container["ports"][0]["containerPort"] == port
    env = env_of(container)
    assert env["ENGRAM_HEALTH_PORT"]["value"] == str(port)
    assert env["ENGRAM_HEALTH_HOST"]["value"] == "0.0.0.0"  # reachable by the kubelet
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port}
    assert env["OTEL_SERVICE_NAME"]["value"] == f"engram-{worker}"


def test_file_mirror_is_a_statefulset_with_a_volume_claim_and_the_edits_worker() -> None:
    objects = render()
    mirror_set = named(objects, "StatefulSet", full("file-mirror"))
    spec = mirror_set["spec"]
    assert spec["replicas"] == 1
    (claim,) = spec["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data"
    assert claim["spec"]["resources"]["requests"]["storage"] == "5Gi"
    mirror, edits = containers(mirror_set)
    assert {m["mountPath"]: m["name"] for m in mirror["volumeMounts"]}["/data"] == "data"
    assert env_of(mirror)["ENGRAM_MIRROR_ROOT"]["value"] == "/data/mirror"
    assert mirror["readinessProbe"]["httpGet"]["port"] == worker_entry("mirror").health_port
    # The edits worker: same image, its own entry point, health port and trace name;
    # it never touches the mirror's volume.
    assert edits["image"] == mirror["image"]
    assert edits["command"] == ["engram-edits"]
    assert edits["readinessProbe"]["httpGet"]["port"] == worker_entry("edits").health_port
    assert env_of(edits)["OTEL_SERVICE_NAME"]["value"] == "engram-edits"
    assert "/data" not in {m["mountPath"] for m in edits["volumeMounts"]}
    service = named(objects, "Service", spec["serviceName"])
    assert service["spec"]["clusterIP"] == "None"
    assert not [d for d in workloads(objects) if d["kind"] == "StatefulSet" and d is not mirror_set]


def test_retrieval_with_a_qdrant_url_is_stateless() -> None:
    objects = render()
    deployment = named(objects, "Deployment", full("retrieval"))
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert "emptyDir" in volumes["data"]
    assert deployment["spec"]["replicas"] == 2
    assert not of_kind(objects, "PersistentVolumeClaim")
    config = named(objects, "ConfigMap", RELEASE)["data"]
    assert config["ENGRAM_QDRANT_URL"] == "http://qdrant:6333"


def test_retrieval_without_qdrant_url_keeps_the_embedded_store_on_one_volume() -> None:
    objects = render(files=("embedded-qdrant-values.yaml",))
    deployment = named(objects, "Deployment", full("retrieval"))
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    claim = named(objects, "PersistentVolumeClaim", f"{full('retrieval')}-data")
    assert volumes["data"]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert "ENGRAM_QDRANT_URL" not in named(objects, "ConfigMap", RELEASE)["data"]


def test_disabled_components_render_nothing() -> None:
    objects = render(files=("partial-values.yaml",))
    present = {component_of(o) for o in objects}
    assert "summarize" not in present
    assert "evict" not in present
    mirror = named(objects, "StatefulSet", full("file-mirror"))
    assert mirror["spec"]["replicas"] == 0
    assert [c["name"] for c in containers(mirror)] == ["mirror"]


# -- pod hardening ---------------------------------------------------------------------


def test_every_container_is_hardened_and_drains_before_sigterm() -> None:
    objects = render(files=("hpa-lag-values.yaml",))
    pods = [w["spec"]["template"]["spec"] for w in workloads(objects)]
    pods += [p["spec"] for p in of_kind(objects, "Pod")]  # the helm test
    assert len(pods) == len(COMPONENTS) + 1
    for pod in pods:
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert pod["automountServiceAccountToken"] is False
        # Service links would inject ENGRAM_GATEWAY_PORT=tcp://... into every pod.
        assert pod["enableServiceLinks"] is False
        for container in pod["containers"]:
            security = container["securityContext"]
            assert security["readOnlyRootFilesystem"] is True
            assert security["allowPrivilegeEscalation"] is False
            assert security["capabilities"] == {"drop": ["ALL"]}
            assert security["runAsNonRoot"] is True
            assert "/tmp" in {m["mountPath"] for m in container["volumeMounts"]}
    for workload in workloads(objects):
        pod = workload["spec"]["template"]["spec"]
        for container in pod["containers"]:
            drain = container["lifecycle"]["preStop"]["sleep"]["seconds"]
            assert 0 < drain < pod["terminationGracePeriodSeconds"]


def test_config_changes_roll_the_pods() -> None:
    def checksum(objects: list[dict]) -> str:
        pod = named(objects, "Deployment", full("ingest"))["spec"]["template"]
        return pod["metadata"]["annotations"]["checksum/config"]

    assert checksum(render()) != checksum(render("config.logLevel=debug"))


# -- autoscaling and disruption budgets ------------------------------------------------


def test_no_autoscaler_unless_enabled() -> None:
    assert not of_kind(render(), "HorizontalPodAutoscaler")
    objects = render("components.ingest.autoscaling.enabled=true")
    (hpa,) = of_kind(objects, "HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"]["name"] == full("ingest")
    assert "replicas" not in named(objects, "Deployment", full("ingest"))["spec"]
    assert named(objects, "Deployment", full("reconcile"))["spec"]["replicas"] == 1


def test_workers_scale_on_their_own_jetstream_consumer_lag() -> None:
    objects = render(files=("hpa-lag-values.yaml",))
    hpas = {component_of(h): h for h in of_kind(objects, "HorizontalPodAutoscaler")}
    assert sorted(hpas) == sorted(set(COMPONENTS) - {"file-mirror"})
    for worker in ("ingest", "reconcile", "summarize", "evict"):
        external = [m for m in hpas[worker]["spec"]["metrics"] if m["type"] == "External"]
        (metric,) = external
        labels = metric["external"]["metric"]["selector"]["matchLabels"]
        assert labels["consumer_name"] == worker
        assert labels["stream_name"] == "ENGRAM"
    reconcile_types = [m["type"] for m in hpas["reconcile"]["spec"]["metrics"]]
    assert reconcile_types == ["External"]  # targetCPUUtilizationPercentage: 0
    for name in ("gateway", "retrieval"):
        assert [m["type"] for m in hpas[name]["spec"]["metrics"]] == ["Resource"]


def test_disruption_budgets_follow_pdb_enabled() -> None:
    pdbs = {component_of(p): p for p in of_kind(render(), "PodDisruptionBudget")}
    assert sorted(pdbs) == sorted(set(COMPONENTS) - {"file-mirror"})
    assert pdbs["gateway"]["spec"]["maxUnavailable"] == 1
    partial = of_kind(render(files=("partial-values.yaml",)), "PodDisruptionBudget")
    gateway = next(p for p in partial if component_of(p) == "gateway")
    assert gateway["spec"] == {
        "minAvailable": 1,
        "selector": gateway["spec"]["selector"],
    }


# -- values that must be refused --------------------------------------------------------


# (values, what the schema says at `helm lint`/`helm template`, what the template's own
# `fail` says when the schema is skipped (--skip-schema-validation), if it checks too)
BAD_VALUES = [
    pytest.param(
        ("components.ingest.replicas=two",),
        "at '/components/ingest/replicas': got string, want integer",
        None,
        id="replicas-two",
    ),
    pytest.param(
        ("components.file-mirror.replicas=2",),
        "at '/components/file-mirror/replicas': maximum: got 2, want 1",
        "the mirror is the single writer of its git tree",
        id="mirror-2",
    ),
    pytest.param(
        ("components.file-mirror.autoscaling.enabled=true",),
        "at '/components/file-mirror/autoscaling/enabled': value must be false",
        "the mirror is a single writer and cannot autoscale",
        id="mirror-hpa",
    ),
    pytest.param(
        ("components.indexer.enabled=true",),
        "at '/components': additional properties 'indexer' not allowed",
        None,
        id="unknown-component",
    ),
    pytest.param(
        ("components.gateway.ui.enabled=no",),
        "at '/components/gateway/ui/enabled': got string, want boolean",
        None,
        id="ui-switch-type",
    ),
    pytest.param(
        ("components.ingest.replica=3",),
        "at '/components/ingest': additional properties 'replica' not allowed",
        None,
        id="unknown-key",
    ),
    pytest.param(("nats.url=http://nats:4222",), "at '/nats/url'", None, id="nats-scheme"),
    pytest.param(
        ("config.env.ENGRAM_LLM_API_KEY=sk-123",),
        "at '/config/env/ENGRAM_LLM_API_KEY': value must be 'secret values go in `secrets`",
        None,
        id="secret-in-env",
    ),
    pytest.param(
        ("qdrant.url=", "components.retrieval.replicas=2"),
        "at '/components/retrieval/replicas': maximum: got 2, want 1",
        "qdrant.url is empty: the embedded store lives on one volume and allows one process",
        id="embedded-2-replicas",
    ),
    pytest.param(
        (
            "qdrant.url=",
            "components.retrieval.replicas=1",
            "components.retrieval.autoscaling.enabled=true",
        ),
        "at '/components/retrieval/autoscaling/enabled': value must be false",
        "autoscaling.enabled needs qdrant.url",
        id="embedded-hpa",
    ),
    pytest.param(
        ("secrets.existingSecret=mine", "secrets.llmApiKey=sk-123"),
        "at '/secrets/llmApiKey': maxLength: got 6, want 0",
        "set either secrets.existingSecret or the secret values",
        id="secret-twice",
    ),
    pytest.param(
        (
            "components.gateway.autoscaling.enabled=true",
            "components.gateway.autoscaling.jetstreamLag.enabled=true",
        ),
        "at '/components/gateway/autoscaling/jetstreamLag/enabled': value must be false",
        "only workers consume from JetStream",
        id="gateway-lag",
    ),
]


@pytest.mark.parametrize(("sets", "schema_message", "fail_message"), BAD_VALUES)
def test_bad_values_fail_lint_and_template_with_a_clear_message(
    sets: tuple[str, ...], schema_message: str, fail_message: str | None
) -> None:
    assert schema_message in lint_error(*sets)
    assert schema_message in render_error(*sets)
    if fail_message is not None:
        assert fail_message in render_error("--skip-schema-validation", *sets)


# -- secrets ----------------------------------------------------------------------------

PLACEHOLDERS = (
    "sha256:af9902c4e71a021600fc3248de4e642437533a9a969076118602c1ef69b612ea=ci-tenant",
    "ci-placeholder-llm-key",
)


def test_no_secret_by_default() -> None:
    objects = render()
    assert not of_kind(objects, "Secret")
    for workload in workloads(objects):
        for container in containers(workload):
            assert "ENGRAM_LLM_API_KEY" not in env_of(container)


def test_secret_values_reach_only_the_secret() -> None:
    objects = render(files=("chart-secret-values.yaml",))
    (secret,) = of_kind(objects, "Secret")
    decoded = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert decoded["ENGRAM_API_KEYS"] == PLACEHOLDERS[0]
    assert decoded["ENGRAM_LLM_API_KEY"] == PLACEHOLDERS[1]
    for obj in objects:
        if obj is secret:
            continue
        text = " ".join(walk_strings(obj))
        for value in (*PLACEHOLDERS, "ci-placeholder-qdrant-key"):
            assert value not in text, f"{obj['kind']}/{obj['metadata']['name']} leaks it"
    (config,) = of_kind(objects, "ConfigMap")
    assert config["data"]["ENGRAM_LLM_MAX_RETRIES"] == "2"  # non-secret config.env passes


def test_keys_go_only_to_the_components_that_use_them() -> None:
    objects = render(files=("existing-secret-values.yaml",))
    assert not of_kind(objects, "Secret")
    refs = {}
    for workload in workloads(objects):
        for container in containers(workload):
            refs[container["name"]] = {
                name: entry["valueFrom"]["secretKeyRef"]
                for name, entry in env_of(container).items()
                if "secretKeyRef" in entry.get("valueFrom", {})
            }
    assert sorted(refs["gateway"]) == ["ENGRAM_API_KEYS", "ENGRAM_LLM_API_KEY"]
    assert sorted(refs["retrieval"]) == ["ENGRAM_QDRANT_API_KEY"]
    for worker in ("ingest", "reconcile", "summarize"):
        assert sorted(refs[worker]) == ["ENGRAM_LLM_API_KEY"]
    for name in ("evict", "mirror", "edits"):
        assert refs[name] == {}
    for ref in (r for keys in refs.values() for r in keys.values()):
        assert ref["name"] == "engram-credentials"
        assert ref["optional"] is True


# -- observability ----------------------------------------------------------------------


def test_otel_identity_per_container_and_endpoint_from_values() -> None:
    objects = render("otel.endpoint=http://collector.observability:4317")
    config = named(objects, "ConfigMap", RELEASE)["data"]
    assert config["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://collector.observability:4317"
    for workload in workloads(objects):
        for container in containers(workload):
            names = [e["name"] for e in container["env"]]
            attributes = env_of(container)["OTEL_RESOURCE_ATTRIBUTES"]["value"]
            assert "k8s.pod.name=$(K8S_POD_NAME)" in attributes
            assert "k8s.namespace.name=$(K8S_NAMESPACE)" in attributes
            assert "service.version=0.1.0" in attributes
            # $(VAR) expands only from variables defined earlier in the list.
            assert names.index("K8S_POD_NAME") < names.index("OTEL_RESOURCE_ATTRIBUTES")
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" not in named(render(), "ConfigMap", RELEASE)["data"]


@pytest.mark.parametrize(
    ("sets", "protocol", "metrics_exporter"),
    [
        ((), "grpc", None),
        (("otel.protocol=http/protobuf",), "http/protobuf", None),
        (
            ("otel.protocol=http/protobuf", "otel.pushMetrics=true"),
            "http/protobuf",
            "prometheus,otlp",
        ),
    ],
)
def test_otlp_protocol_and_metrics_push_from_values(
    sets: tuple[str, ...], protocol: str, metrics_exporter: str | None
) -> None:
    config = named(render("otel.endpoint=http://alloy:4318", *sets), "ConfigMap", RELEASE)["data"]
    assert config["OTEL_EXPORTER_OTLP_PROTOCOL"] == protocol
    assert config.get("OTEL_METRICS_EXPORTER") == metrics_exporter
    # Without an endpoint nothing is exported, so neither is set.
    quiet = named(render(*sets), "ConfigMap", RELEASE)["data"]
    assert "OTEL_EXPORTER_OTLP_PROTOCOL" not in quiet and "OTEL_METRICS_EXPORTER" not in quiet


def test_an_otlp_protocol_engram_cannot_export_is_refused() -> None:
    message = "at '/otel/protocol': value must be one of 'grpc', 'http/protobuf'"
    assert message in render_error("otel.protocol=http/json")


# -- helm test and ingress --------------------------------------------------------------


def test_helm_test_checks_gateway_health_and_a_retrieval_search() -> None:
    (pod,) = of_kind(render(), "Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    (container,) = pod["spec"]["containers"]
    script = container["args"][0]
    assert "/healthz" in script and "/readyz" in script
    assert '"/readyz/memory"' in script  # memory checked apart from readiness
    assert '"/ui/"' in script and '"/mcp"' in script
    assert "MemoryServiceStub" in script and ".Search(" in script
    env = env_of(container)
    assert env["GATEWAY_URL"]["value"] == f"http://{full('gateway')}:8100"
    assert env["RETRIEVAL_ADDRESS"]["value"] == f"{full('retrieval')}:50051"
    assert not of_kind(render("tests.enabled=false"), "Pod")


def test_ingress_routes_to_the_gateway_service() -> None:
    assert not of_kind(render(), "Ingress")
    objects = render(files=("ingress-no-networkpolicy-values.yaml",))
    (ingress,) = of_kind(objects, "Ingress")
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": full("gateway"), "port": {"number": 80}}
    assert named(objects, "Service", full("gateway"))["spec"]["ports"][0]["port"] == 80
    assert not of_kind(objects, "NetworkPolicy")


def _ingress_paths(*sets: str) -> list[tuple[str, str]]:
    (ingress,) = of_kind(render("ingress.enabled=true", *sets), "Ingress")
    (rule,) = ingress["spec"]["rules"]
    return [(p["path"], p["pathType"]) for p in rule["http"]["paths"]]


def test_ingress_routes_the_public_paths_of_what_is_switched_on() -> None:
    assert _ingress_paths() == [
        ("/v1", "Prefix"),
        ("/ui", "Prefix"),
        ("/", "Exact"),
        ("/mcp", "Exact"),
    ]  # never /metrics nor the probes
    assert _ingress_paths("components.gateway.ui.enabled=false") == [
        ("/v1", "Prefix"),
        ("/mcp", "Exact"),
    ]
    assert _ingress_paths("components.gateway.mcp.enabled=false")[-1] == ("/", "Exact")
    explicit = (
        "ingress.hosts[0].host=engram.example.org,"
        "ingress.hosts[0].paths[0].path=/engram,ingress.hosts[0].paths[0].pathType=Prefix"
    )
    assert _ingress_paths(explicit) == [("/engram", "Prefix")]


@pytest.mark.parametrize("switch", ["ui", "mcp"])
def test_the_browser_and_mcp_are_on_by_default_and_each_can_be_turned_off(switch: str) -> None:
    variable = f"ENGRAM_GATEWAY_{switch.upper()}"

    def gateway_env(*sets: str) -> dict[str, Obj]:
        (container,) = containers(named(render(*sets), "Deployment", full("gateway")))
        return env_of(container)

    assert gateway_env()[variable]["value"] == "true"
    assert gateway_env(f"components.gateway.{switch}.enabled=false")[variable]["value"] == "false"
    (pod,) = of_kind(render(f"components.gateway.{switch}.enabled=false"), "Pod")
    assert env_of(pod["spec"]["containers"][0])[f"{switch.upper()}_ENABLED"]["value"] == "false"
    message = lint_error(f"components.ingest.{switch}.enabled=false")
    assert f"at '/components/ingest': additional properties '{switch}' not allowed" in message


def test_workers_expose_their_health_port_for_scraping() -> None:
    objects = render()
    for worker in WORKERS:
        service = named(objects, "Service", full(worker))
        assert service["spec"]["ports"][0]["name"] == "health"


# -- network policy ---------------------------------------------------------------------

# Distinct peers for NATS, Qdrant and the collector, so a flow can be told by its peer.
PEER_VALUES = (
    "networkPolicy.nats.to[0].podSelector.matchLabels.app=nats",
    "networkPolicy.qdrant.to[0].podSelector.matchLabels.app=qdrant",
    "networkPolicy.otlp.to[0].podSelector.matchLabels.app=collector",
    "networkPolicy.llm.cidrs[0]=203.0.113.0/24",
    "otel.endpoint=http://collector:4317",
)


def _peer_name(peer: dict) -> str:
    if "ipBlock" in peer:
        return f"llm {peer['ipBlock']['cidr']}"
    if "namespaceSelector" in peer:
        return "dns"
    labels = peer["podSelector"].get("matchLabels", {})
    if "app" in labels:
        return labels["app"]
    return labels["app.kubernetes.io/component"]


def _flows(objects: list[Obj]) -> tuple[set[tuple[str, str, int]], set[tuple[str, str, int]]]:
    """(ingress, egress) flows as (pod component, peer, port); peer "any" when open."""
    ingress, egress = set(), set()
    for policy in of_kind(objects, "NetworkPolicy"):
        owner = policy["spec"]["podSelector"]["matchLabels"].get("app.kubernetes.io/component")
        if owner is None:
            continue
        for rule in policy["spec"].get("ingress") or []:
            sources: list[str] = []
            for peer in rule.get("from", [{}]):
                expressions = peer.get("podSelector", {}).get("matchExpressions", [])
                comp = [e for e in expressions if e["key"] == "app.kubernetes.io/component"]
                sources += comp[0]["values"] if comp else ["any"]
            for source in sources:
                for port in rule["ports"]:
                    ingress.add((owner, source, port["port"]))
        for rule in policy["spec"]["egress"]:
            peers = [_peer_name(p) for p in rule.get("to", [])] or ["any"]
            for peer in peers:
                for port in rule["ports"]:
                    egress.add((owner, peer, port["port"]))
    return ingress, egress


def test_network_policy_denies_by_default_and_allows_exactly_the_listed_flows() -> None:
    objects = render(*PEER_VALUES)
    deny = named(objects, "NetworkPolicy", f"{RELEASE}-default-deny")
    assert deny["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert "ingress" not in deny["spec"] and "egress" not in deny["spec"]
    assert deny["spec"]["podSelector"]["matchLabels"] == {
        "app.kubernetes.io/name": "engram",
        "app.kubernetes.io/instance": RELEASE,
    }

    ingress, egress = _flows(objects)
    callers = ("gateway", "ingest", "reconcile", "summarize", "evict", "file-mirror", "helm-test")
    assert ingress == {("gateway", "any", 8100)} | {
        ("retrieval", caller, 50051) for caller in callers
    }

    def base(component: str) -> set[tuple[str, str, int]]:
        return {
            (component, "dns", 53),
            (component, "collector", 4317),
            (component, "collector", 4318),
        }

    llm = {("llm 203.0.113.0/24", 443), ("llm 203.0.113.0/24", 11434)}
    expected: set[tuple[str, str, int]] = set()
    for component in ("gateway", "ingest", "reconcile", "summarize", "evict", "file-mirror"):
        expected |= base(component)
        expected |= {(component, "retrieval", 50051), (component, "nats", 4222)}
    for component in ("gateway", "ingest", "reconcile", "summarize"):
        expected |= {(component, peer, port) for peer, port in llm}
    expected |= base("retrieval") | {("retrieval", "qdrant", 6333), ("retrieval", "qdrant", 6334)}
    expected |= base("helm-test") | {
        ("helm-test", "gateway", 8100),
        ("helm-test", "retrieval", 50051),
    }
    assert egress == expected


def test_network_policy_without_a_qdrant_server_or_collector_opens_neither() -> None:
    _, egress = _flows(render("qdrant.url=", "components.retrieval.replicas=1"))
    assert {peer for component, peer, _ in egress if component == "retrieval"} == {"dns"}
    assert not [flow for flow in egress if flow[2] in (4317, 4318)]


def test_scrapers_in_health_from_reach_worker_health_and_retrieval_metrics_ports() -> None:
    scraper = "networkPolicy.healthFrom[0].namespaceSelector.matchLabels.name=monitoring"
    ingress, _ = _flows(render(*PEER_VALUES, scraper))
    scraped = {(owner, port) for owner, source, port in ingress if source == "any"}
    assert ("retrieval", 9464) in scraped
    assert {("ingest", 8201), ("reconcile", 8202), ("file-mirror", 8206)} <= scraped
    # without a scraper, neither port is open
    ingress, _ = _flows(render(*PEER_VALUES))
    assert not {(o, p) for o, _, p in ingress if p in (9464, 8201)}
