#!/usr/bin/env python3
"""deploy/k8s: every overlay renders offline with every kubectl found (the
current one and Debian's 1.20, whose kustomize is v2) to the same objects,
validates against the API schemas of Kubernetes 1.27 (the first with gRPC
probes) and of the newest the validator knows, passes the policy checker,
and has the structure docs/deploy.md promises (probes, requests = limits,
GPUs only on GPU workers, /dev/shm in memory, NCCL settings, secrets as
files, pod IPs from the downward API, workloads that scale alone). The
negative fixtures, and mutated copies of the rendered objects, prove that
each check can fail.

Run with the deploy venv's python (scripts/setup.sh --deploy):
  .venv-deploy/bin/python tests/deploy/k8s_test.py
Environment: BATON_KUBECTLS, a colon-separated list of kubectl binaries
(default: every kubectl on PATH and .venv-deploy/bin/kubectl-1.20).
"""

import copy
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

import kubernetes_validate
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
K8S = os.path.join(ROOT, "deploy", "k8s")
NEGATIVE = os.path.join(ROOT, "tests", "deploy", "k8s_negative")
OVERLAYS = ["cpu-demo", "gpu"]
SCHEMA_VERSIONS = ["1.27.0", kubernetes_validate.latest_version()]
# Policy checks an overlay is exempt from, and why.
POLICY_SKIPS = {
    "cpu-demo": {
        "CKV_K8S_43": "the demo image is built and loaded into the nodes by hand: no registry digest",
        "CKV_K8S_15": "IfNotPresent, so the hand-loaded image is used rather than pulled",
    },
    "gpu": {
        "CKV_K8S_43": "the digest exists once the user pushes the image; the overlay says to pin it",
    },
}
WORKERS = ["baton-prefill-worker", "baton-decode-worker"]


def kubectls():
    listed = os.environ.get("BATON_KUBECTLS")
    if listed:
        return [k for k in listed.split(":") if k]
    found = []
    if shutil.which("kubectl"):
        found.append(shutil.which("kubectl"))
    old = os.path.join(os.path.dirname(sys.executable), "kubectl-1.20")
    if os.path.exists(old):
        found.append(old)
    return found


def render(kubectl, overlay):
    r = subprocess.run([kubectl, "kustomize", os.path.join(K8S, "overlays", overlay)],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise AssertionError(f"{kubectl} kustomize {overlay}: {r.stderr}")
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def key(obj):
    return (obj["kind"], obj["metadata"]["name"])


def normalized(obj):
    """Lists of named items sorted by name: kustomize versions merge patches
    into env, volumes and ports in different orders."""
    if isinstance(obj, dict):
        return {k: normalized(v) for k, v in obj.items()}
    if isinstance(obj, list):
        items = [normalized(v) for v in obj]
        if all(isinstance(v, dict) and "name" in v for v in items):
            items.sort(key=lambda v: str(v["name"]))
        return items
    return obj


def pod_specs(objects):
    for obj in objects:
        if obj["kind"] == "Deployment":
            yield obj["metadata"]["name"], obj["spec"]["template"]["spec"]


def check_structure(objects, overlay):
    """What the manifests promise; returns a list of problems."""
    problems = []
    by_key = {key(o): o for o in objects}
    deployments = {n: s for n, s in pod_specs(objects)}
    for name in ["baton-coordinator"] + WORKERS:
        if name not in deployments:
            problems.append(f"no Deployment {name}")
    if ("Service", "baton-coordinator") not in by_key:
        problems.append("no Service baton-coordinator")
    replicas = by_key.get(("Service", "baton-coordinator-replicas"), {}).get("spec", {})
    if replicas.get("clusterIP") != "None" or not replicas.get("publishNotReadyAddresses"):
        problems.append("no headless Service baton-coordinator-replicas listing every "
                        "coordinator replica (also before it is ready)")

    for name, spec in deployments.items():
        worker = name in WORKERS
        if spec.get("terminationGracePeriodSeconds", 30) < 30:
            problems.append(f"{name}: terminationGracePeriodSeconds under 30 s")
        if spec.get("automountServiceAccountToken") is not False:
            problems.append(f"{name}: mounts a service account token")
        for c in spec.get("initContainers", []) + spec["containers"]:
            where = f"{name}/{c['name']}"
            res = c.get("resources", {})
            if not res.get("requests") or res.get("requests") != res.get("limits"):
                problems.append(f"{where}: resources.requests != limits")
            for r in ("cpu", "memory"):
                if r not in res.get("limits", {}):
                    problems.append(f"{where}: no {r} limit")
            gpus = res.get("limits", {}).get("nvidia.com/gpu")
            main = c in spec["containers"]
            if overlay == "gpu" and worker and main:
                if gpus != 1:
                    problems.append(f"{where}: a GPU worker without nvidia.com/gpu: 1")
            elif gpus is not None:
                problems.append(f"{where}: nvidia.com/gpu outside a GPU worker")
            if c.get("image", "").endswith(":latest") or ":" not in c.get("image", ""):
                problems.append(f"{where}: image '{c.get('image')}' has no fixed tag")
            env = c.get("env", [])
            defined = set()
            for e in env:
                for ref in re.findall(r"\$\((\w+)\)", str(e.get("value", ""))):
                    if ref not in defined:
                        problems.append(f"{where}: {e['name']} uses $({ref}) before it is defined")
                if re.search(r"\b\d+\.\d+\.\d+\.\d+\b", str(e.get("value", ""))):
                    problems.append(f"{where}: {e['name']} holds an address ({e['value']})")
                if "secretKeyRef" in str(e.get("valueFrom", "")):
                    problems.append(f"{where}: {e['name']} takes a secret as an environment variable")
                defined.add(e["name"])
            if not main:
                continue
            ports = {p["containerPort"] for p in c.get("ports", [])}
            probe = c.get("readinessProbe", {}).get("grpc", {})
            if probe.get("port") not in ports:
                problems.append(f"{where}: no grpc.health.v1 readiness probe on a port it serves")
            if worker:
                byname = {e["name"]: e for e in env}
                if byname.get("POD_IP", {}).get("valueFrom", {}).get("fieldRef", {}).get(
                        "fieldPath") != "status.podIP":
                    problems.append(f"{where}: POD_IP not from the downward API")
                if byname.get("BATON_HOST", {}).get("value") != "$(POD_IP)":
                    problems.append(f"{where}: BATON_HOST is not the pod IP")
                if byname.get("BATON_COORDINATOR", {}).get("value") != \
                        "baton-coordinator-replicas:50052":
                    problems.append(f"{where}: BATON_COORDINATOR is not the coordinator "
                                    "replicas' headless Service")
                mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
                volumes = {v["name"]: v for v in spec.get("volumes", [])}
                shm = volumes.get(mounts.get("/dev/shm"), {}).get("emptyDir", {})
                if shm.get("medium") != "Memory" or not shm.get("sizeLimit"):
                    problems.append(f"{where}: /dev/shm is not a sized memory emptyDir")
                nccl = [f["configMapRef"]["name"] for f in c.get("envFrom", [])
                        if "configMapRef" in f and f["configMapRef"]["name"] == "baton-nccl"]
                if overlay == "gpu" and not nccl:
                    problems.append(f"{where}: no NCCL settings (configMap baton-nccl)")
    if overlay == "gpu":
        nccl = by_key.get(("ConfigMap", "baton-nccl"))
        if not nccl or not all(k.startswith("NCCL_") for k in nccl.get("data", {})):
            problems.append("configMap baton-nccl missing or holding more than NCCL_* settings")
        coordinator = deployments.get("baton-coordinator", {})
        secrets = {v["secret"]["secretName"] for v in coordinator.get("volumes", []) if "secret" in v}
        for s in ("baton-public-tls", "baton-api-keys"):
            if s not in secrets:
                problems.append(f"baton-coordinator: secret {s} not mounted as files")

    # Each workload scales alone: disjoint selectors, no peer lists (a
    # Service name, the coordinator's, is how pods find each other).
    services = {o["metadata"]["name"] for o in objects if o["kind"] == "Service"}
    labels = {n: o["spec"]["template"]["metadata"]["labels"] for n, o in
              ((o["metadata"]["name"], o) for o in objects if o["kind"] == "Deployment")}
    for n, o in ((o["metadata"]["name"], o) for o in objects if o["kind"] == "Deployment"):
        selector = o["spec"]["selector"]["matchLabels"]
        for other, other_labels in labels.items():
            if other != n and all(other_labels.get(k) == v for k, v in selector.items()):
                problems.append(f"{n}: its selector also matches the pods of {other}")
        text = yaml.safe_dump(o["spec"]["template"])
        for other in labels:
            if other != n and other not in services and other in text:
                problems.append(f"{n}: names {other} (a peer list)")
    return problems


class K8sTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.kubectls = kubectls()
        if not cls.kubectls:
            raise unittest.SkipTest("no kubectl (scripts/setup.sh --deploy)")
        print(f"k8s_test: kubectl binaries: {cls.kubectls}; schemas {SCHEMA_VERSIONS}",
              file=sys.stderr)
        cls.rendered = {o: render(cls.kubectls[0], o) for o in OVERLAYS}
        cls.dir = tempfile.TemporaryDirectory()

    @classmethod
    def tearDownClass(cls):
        cls.dir.cleanup()

    def test_every_kubectl_renders_the_same_objects(self):
        for overlay in OVERLAYS:
            reference = sorted((normalized(o) for o in self.rendered[overlay]), key=key)
            for kubectl in self.kubectls[1:]:
                with self.subTest(overlay=overlay, kubectl=kubectl):
                    other = sorted((normalized(o) for o in render(kubectl, overlay)), key=key)
                    self.assertEqual([key(o) for o in other], [key(o) for o in reference])
                    self.assertEqual(other, reference)

    def test_schemas(self):
        for overlay in OVERLAYS:
            for version in SCHEMA_VERSIONS:
                for obj in self.rendered[overlay]:
                    with self.subTest(overlay=overlay, version=version, object=key(obj)):
                        kubernetes_validate.validate(obj, version, strict=True)

    def test_schema_check_can_fail(self):
        with open(os.path.join(NEGATIVE, "schema_invalid.yaml")) as f:
            obj = yaml.safe_load(f)
        for version in SCHEMA_VERSIONS:
            with self.assertRaises(kubernetes_validate.ValidationError):
                kubernetes_validate.validate(obj, version, strict=True)

    def checkov(self, path, skips):
        checkov = os.path.join(os.path.dirname(sys.executable), "checkov")
        args = [checkov, "-f", path, "--framework", "kubernetes", "--quiet", "--compact",
                "--skip-download"]
        if skips:
            args += ["--skip-check", ",".join(sorted(skips))]
        env = dict(os.environ, BC_SKIP_MAPPING="TRUE")
        return subprocess.run(args, capture_output=True, text=True, timeout=300, env=env)

    def test_policy(self):
        for overlay in OVERLAYS:
            with self.subTest(overlay=overlay):
                path = os.path.join(self.dir.name, f"{overlay}.yaml")
                with open(path, "w") as f:
                    yaml.safe_dump_all(self.rendered[overlay], f)
                for check, why in POLICY_SKIPS[overlay].items():
                    print(f"k8s_test: {overlay}: {check} skipped: {why}", file=sys.stderr)
                r = self.checkov(path, POLICY_SKIPS[overlay])
                self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
                self.assertRegex(r.stdout, r"Passed checks: [1-9]\d*, Failed checks: 0")

    def test_policy_check_can_fail(self):
        r = self.checkov(os.path.join(NEGATIVE, "policy_violation.yaml"), {})
        self.assertNotEqual(r.returncode, 0, r.stdout)
        for check in ("CKV_K8S_16", "CKV_K8S_11", "CKV_K8S_14"):  # privileged, CPU limit, :latest
            self.assertIn(check, r.stdout)

    def test_structure(self):
        for overlay in OVERLAYS:
            with self.subTest(overlay=overlay):
                self.assertEqual(check_structure(self.rendered[overlay], overlay), [])

    def test_structure_check_can_fail(self):
        def deployment(objects, name):
            return next(o for o in objects if key(o) == ("Deployment", name))

        def container(objects, name):
            return deployment(objects, name)["spec"]["template"]["spec"]["containers"][0]

        def gpu_on_coordinator(o):
            container(o, "baton-coordinator")["resources"]["limits"]["nvidia.com/gpu"] = 1

        def requests_below_limits(o):
            container(o, "baton-decode-worker")["resources"]["requests"]["cpu"] = "1"

        def shm_on_disk(o):
            for v in deployment(o, "baton-prefill-worker")["spec"]["template"]["spec"]["volumes"]:
                if v["name"] == "dshm":
                    v["emptyDir"].pop("medium")

        def peer_list(o):
            container(o, "baton-decode-worker")["env"].append(
                {"name": "PEERS", "value": "baton-prefill-worker-0,10.0.0.7:50060"})

        def no_probe(o):
            container(o, "baton-prefill-worker").pop("readinessProbe")

        def shared_selector(o):
            deployment(o, "baton-decode-worker")["spec"]["selector"]["matchLabels"] = {
                "app.kubernetes.io/part-of": "baton"}

        def secret_in_env(o):
            container(o, "baton-coordinator")["env"].append(
                {"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "k", "key": "k"}}})

        def no_nccl(o):
            c = container(o, "baton-decode-worker")
            c["envFrom"] = [f for f in c["envFrom"] if f["configMapRef"]["name"] != "baton-nccl"]

        def one_coordinator_address(o):
            next(x for x in o if key(x) == ("Service", "baton-coordinator-replicas"))[
                "spec"]["clusterIP"] = "10.0.0.9"

        cases = {
            "no headless Service baton-coordinator-replicas": one_coordinator_address,
            "nvidia.com/gpu outside a GPU worker": gpu_on_coordinator,
            "resources.requests != limits": requests_below_limits,
            "/dev/shm is not a sized memory emptyDir": shm_on_disk,
            "holds an address": peer_list,
            "names baton-prefill-worker (a peer list)": peer_list,
            "no grpc.health.v1 readiness probe": no_probe,
            "its selector also matches the pods of": shared_selector,
            "takes a secret as an environment variable": secret_in_env,
            "no NCCL settings": no_nccl,
        }
        for expected, mutate in cases.items():
            with self.subTest(expected=expected):
                objects = copy.deepcopy(self.rendered["gpu"])
                mutate(objects)
                problems = check_structure(objects, "gpu")
                self.assertTrue(any(expected in p for p in problems), problems)


if __name__ == "__main__":
    unittest.main()
