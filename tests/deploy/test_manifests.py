"""The manifests of deploy/kubernetes/ against the Kubernetes schemas, and against the config
they carry: every object validates (strictly: an unknown or misspelt field is an error) against
the schemas of Kubernetes 1.37 that kubernetes-validate ships, and the memory limit, replicas and
probes agree with the spillway config of the ConfigMap.

The ServiceMonitor is a prometheus-operator CRD: kubernetes-validate has no schema for it, so it
is checked here field by field against the Service it scrapes instead (and the test fails if any
other kind lacks a schema). kustomization.yaml is kustomize's own file, checked to list every
manifest but the examples.

Run: SPILLWAY_BIN=target/debug/spillway python -m pytest tests/deploy
"""

import json
import os
import pathlib
import subprocess
import tomllib

import kubernetes_validate
import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "kubernetes"
K8S_VERSION = "1.37.0"
NO_SCHEMA = {("monitoring.coreos.com/v1", "ServiceMonitor")}


def documents():
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                yield path, doc


def named(kind, name="spillway"):
    found = [d for _, d in documents() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def config():
    return tomllib.loads(named("ConfigMap")["data"]["spillway.toml"])


def gateway():
    containers = named("Deployment")["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "spillway")


def mebibytes(q):
    assert q.endswith("Mi") or q.endswith("Gi"), q
    return int(q[:-2]) * (1 << 20 if q.endswith("Mi") else 1 << 30)


@pytest.mark.parametrize(
    "path,doc",
    list(documents()),
    ids=lambda v: v.name if isinstance(v, pathlib.Path) else f"{v['kind']}/{v['metadata']['name']}",
)
def test_every_manifest_validates_against_the_kubernetes_schemas(path, doc):
    if (doc["apiVersion"], doc["kind"]) in NO_SCHEMA:
        with pytest.raises(kubernetes_validate.SchemaNotFoundError):
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        return
    # Raises ValidationError naming the field; SchemaNotFoundError for a kind it does not know.
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_the_schema_check_rejects_a_broken_manifest():
    bad = json.loads(json.dumps(named("Deployment")))
    bad["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGet"]["paht"] = "/livez"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def test_the_service_monitor_scrapes_the_admin_port_of_the_service():
    monitor = named("ServiceMonitor")
    service = named("Service")
    labels = service["metadata"]["labels"]
    for k, v in monitor["spec"]["selector"]["matchLabels"].items():
        assert labels.get(k) == v, (k, v, labels)
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout"}
    port = ports[endpoint["port"]]
    container_ports = {p["name"]: p["containerPort"] for p in gateway()["ports"]}
    admin = int(config()["server"]["admin_listen"].rsplit(":", 1)[1])
    assert container_ports[port["targetPort"]] == admin


def test_the_memory_limit_covers_the_budget_spillway_audit_computes():
    out = subprocess.run(
        [os.environ.get("SPILLWAY_BIN", str(ROOT / "target/debug/spillway")),
         "audit", str(K8S), "--json", "--fail-on", "info"],
        capture_output=True, text=True, check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert report["findings"] == []
    (cfg,) = report["configs"]
    assert cfg["object"] == "ConfigMap/spillway data[spillway.toml]"
    budget = cfg["memory_budget_bytes"]
    resources = gateway()["resources"]
    limit = mebibytes(resources["limits"]["memory"])
    assert limit >= budget, (limit, budget)
    # Not far above it either: the caps are what size the container.
    assert limit < budget * 1.25, (limit, budget)
    assert mebibytes(resources["requests"]["memory"]) == limit


def test_replicas_shutdown_and_probes_follow_the_config():
    c = config()
    deployment = named("Deployment")
    hpa = named("HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert c["admission"]["instances"] == hpa["spec"]["maxReplicas"]
    assert deployment["spec"]["replicas"] == hpa["spec"]["minReplicas"]
    pdb = named("PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] < hpa["spec"]["minReplicas"]
    assert c["server"]["listen"].startswith("0.0.0.0:")
    assert c["server"]["admin_listen"].startswith("0.0.0.0:")
    seconds = lambda d: int(d.rstrip("s"))
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace >= seconds(c["server"]["shutdown_delay"]) + seconds(c["server"]["shutdown_grace"]) + 5
    g = gateway()
    assert g["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "admin"}
    assert g["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}
    assert g["startupProbe"]["httpGet"]["path"] == "/livez"
    ready = g["readinessProbe"]
    # /readyz turns 503 at SIGTERM: the endpoints must see it within shutdown_delay.
    assert ready["periodSeconds"] * ready["failureThreshold"] < seconds(c["server"]["shutdown_delay"])


def test_secrets_come_from_the_secret_and_never_sit_in_the_config():
    c = config()
    assert "url" not in c["store"] and c["store"]["url_env"] == "SPILLWAY_STORE_URL"
    assert "redis" not in c["cache"] and "redis" not in c["admission"]
    env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in gateway()["env"]}
    secret = named("Secret")
    wanted = {c["store"]["url_env"], c["cache"]["redis_env"], c["admission"]["redis_env"], "SPILLWAY_ADMIN_TOKEN"}
    wanted |= {k["env"] for t in c["tenants"] for k in t["keys"]}
    assert wanted <= set(env), wanted - set(env)
    for ref in env.values():
        assert ref["name"] == "spillway"
        assert ref["key"] in secret["stringData"]


def test_the_kustomization_lists_every_manifest_but_the_examples():
    k = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    listed = set(k["resources"])
    shipped = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == {n for n in shipped if not n.endswith(".example.yaml")}
