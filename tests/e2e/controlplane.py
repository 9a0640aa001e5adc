"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, controller-manager, scheduler, KWOK, Kueue.

Built by `e2e/build-tools.sh` into `.e2e/`. Every process gets free ports and its own folder, runs in its own
process group and is stopped (group and all) when the control plane closes, so two runs never clash and nothing
is left behind. Kueue runs out of cluster with the Configuration the stack renders, changed only where an
in-cluster deployment would provide something; the apiserver calls its webhooks by URL with our CA.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import fcntl
import json
import os
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Iterable, Iterator, NamedTuple

import yaml

ROOT = Path(__file__).resolve().parents[2]
TOOLS = Path(os.environ.get("GPUCLUSTER_E2E_TOOLS", ROOT / ".e2e"))
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kwok", "kueue",
            "mpi-operator", "node-problem-detector", "helm", "slurm-operator")
# Pod CIDR and service range are addresses the apiserver hands out, never contacted: webhooks are called by URL.
SERVICE_RANGE = "10.96.0.0/16"
# held while an MPI operator runs on this machine (its fixed port, ControlPlane.mpi_operator)
MPI_OPERATOR_LOCK = Path("/tmp/gpucluster-e2e-mpi-operator.lock")


class ControlPlaneError(RuntimeError):
    pass


class _Resource(NamedTuple):
    prefix: str              # the API path of its group version (/api/v1, /apis/batch/v1)
    plural: str
    api_version: str
    kind: str
    namespaced: bool


def missing_tools() -> list[str]:
    have = [b for b in BINARIES if (TOOLS / "bin" / b).is_file()]
    out = [b for b in BINARIES if b not in have]
    out += [d for d in ("kwok-stages", "kueue-crds", "kueue-webhooks", "mpi-operator-crds", "slinky-charts",
                        "prometheus-operator-crds", "slurm-root") if not (TOOLS / d).is_dir()]
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_certs(d: Path) -> None:
    """A CA, serving certs for the apiserver and Kueue's webhooks (127.0.0.1), an admin client cert, SA keys."""
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
             "-subj", "/CN=gpucluster-e2e-ca", cwd=d)

    def issue(name: str, subject: str, ext: str) -> None:
        (d / f"{name}.ext").write_text(ext)
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", subject, cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-days", "2", "-out", f"{name}.crt", "-extfile", f"{name}.ext", cwd=d)

    serving = "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"
    issue("apiserver", "/CN=kube-apiserver", serving)
    issue("webhook", "/CN=kueue-webhook", serving)
    issue("admin", "/O=system:masters/CN=gpucluster-e2e-admin", "extendedKeyUsage=clientAuth\n")
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=d)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=d)


class ControlPlane:
    """Start with `start()`, always `close()` (also on failure). `kubectl()` talks to it as cluster admin."""

    def __init__(self, kueue_config: dict[str, Any], workdir: Path | None = None):
        self.kueue_config = kueue_config
        self.dir = Path(workdir or tempfile.mkdtemp(prefix="gpucluster-e2e-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.bin = TOOLS / "bin"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.kubeconfig = self.dir / "admin.kubeconfig"
        self._tls: ssl.SSLContext | None = None
        self._resources: dict[str, _Resource] | None = None

    # --- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> ControlPlane:
        missing = missing_tools()
        if missing:
            raise ControlPlaneError(f"control-plane tools missing in {TOOLS}: {', '.join(missing)}; "
                                    "run `make e2e-tools` (builds them from Go modules)")
        atexit.register(self.close)         # also when the test run is interrupted
        certs = self.dir / "pki"
        certs.mkdir(exist_ok=True)
        make_certs(certs)
        self._etcd()
        self._apiserver(certs)
        self._write_kubeconfig(certs)
        self._start("kube-controller-manager", [
            f"--kubeconfig={self.kubeconfig}", f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}", "--bind-address=127.0.0.1",
            f"--secure-port={free_port()}", "--leader-elect=false", "--controllers=*,-nodeipam",
            f"--service-account-private-key-file={certs / 'sa.key'}", f"--root-ca-file={certs / 'ca.crt'}",
            "--use-service-account-credentials=false", f"--cert-dir={self.dir / 'kcm-certs'}",
            # A late KWOK heartbeat on a busy 2-core machine must not mark a node NotReady: Kueue would then
            # evict its workloads as node failures. Node failure is not what these tests are about.
            "--node-monitor-grace-period=10m"])
        self._start("kube-scheduler", [
            f"--kubeconfig={self.kubeconfig}", f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}", "--bind-address=127.0.0.1",
            f"--secure-port={free_port()}", "--leader-elect=false", f"--cert-dir={self.dir / 'sched-certs'}"])
        self._kwok()
        self._kueue(certs)
        return self

    def close(self) -> None:
        for name, proc in reversed(list(self.procs.items())):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    continue
        deadline = time.monotonic() + 5      # throwaway state: no need for a graceful shutdown
        for proc in self.procs.values():
            _reap(proc, max(0.1, deadline - time.monotonic()))
        left = [name for name, proc in self.procs.items() if _alive(proc.pid)]
        self.procs.clear()
        if left:
            raise ControlPlaneError(f"processes left running after close: {', '.join(left)}")

    def log(self, name: str, lines: int = 40) -> str:
        path = self.dir / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def _start(self, name: str, args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = open(self.dir / f"{name}.log", "wb")
        proc = subprocess.Popen([str(self.bin / name), *args], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=self.dir, start_new_session=True,
                                env={**os.environ, **(env or {})})
        log.close()
        self.procs[name] = proc
        return proc

    def _wait(self, name: str, ready: Any, timeout_s: float = 90) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            proc = self.procs[name]
            if proc.poll() is not None:
                raise ControlPlaneError(f"{name} exited with {proc.returncode}:\n{self.log(name)}")
            try:
                if ready():
                    return
            except (OSError, ValueError, subprocess.SubprocessError):
                pass
            time.sleep(0.5)
        raise ControlPlaneError(f"{name} not ready after {timeout_s:.0f} s:\n{self.log(name)}")

    # --- the processes -------------------------------------------------------------------------------------
    def _etcd(self) -> None:
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        self._start("etcd", [
            "--name=e2e", f"--data-dir={self.dir / 'etcd'}", f"--listen-client-urls={self.etcd_url}",
            f"--advertise-client-urls={self.etcd_url}", f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=e2e=http://127.0.0.1:{peer}", "--unsafe-no-fsync", "--log-level=warn"])
        self._wait("etcd", lambda: _get(f"{self.etcd_url}/health").startswith("{\"health\":\"true\""))

    def _apiserver(self, certs: Path) -> None:
        port = free_port()
        self.server = f"https://127.0.0.1:{port}"
        self._start("kube-apiserver", [
            f"--etcd-servers={self.etcd_url}", "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
            f"--secure-port={port}", f"--tls-cert-file={certs / 'apiserver.crt'}",
            f"--tls-private-key-file={certs / 'apiserver.key'}", f"--client-ca-file={certs / 'ca.crt'}",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={certs / 'sa.pub'}",
            f"--service-account-signing-key-file={certs / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_RANGE}", "--authorization-mode=RBAC",
            "--allow-privileged=true", "--endpoint-reconciler-type=none", f"--cert-dir={self.dir / 'apiserver-certs'}"])
        context = ssl.create_default_context(cafile=str(certs / "ca.crt"))
        context.load_cert_chain(str(certs / "admin.crt"), str(certs / "admin.key"))
        self._ssl = context
        self._wait("kube-apiserver", lambda: _get(f"{self.server}/readyz", context) == "ok", timeout_s=120)

    def _write_kubeconfig(self, certs: Path) -> None:
        b64 = lambda p: base64.b64encode(p.read_bytes()).decode()  # noqa: E731
        self.kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "e2e",
            "clusters": [{"name": "e2e", "cluster": {"server": self.server,
                                                     "certificate-authority-data": b64(certs / "ca.crt")}}],
            "users": [{"name": "admin", "user": {"client-certificate-data": b64(certs / "admin.crt"),
                                                 "client-key-data": b64(certs / "admin.key")}}],
            "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "admin"}}]}))

    def _kwok(self) -> None:
        stages = sorted((TOOLS / "kwok-stages").glob("*.yaml"))
        self._start("kwok", [
            f"--kubeconfig={self.kubeconfig}", "--manage-all-nodes=false",
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            f"--server-address=127.0.0.1:{free_port()}", *[f"--config={s}" for s in stages],
            # Fake nodes' and pods' addresses stay on loopback: nothing is ever sent to them, and nothing may be.
            "--node-ip=127.0.0.1", "--cidr=127.16.0.0/16"])
        time.sleep(1)
        self._wait("kwok", lambda: True)

    def _kueue(self, certs: Path) -> None:
        """Kueue with the stack's Configuration; only ports, certificates and leader election change."""
        webhook_port, health_port, metrics_port = free_port(), free_port(), free_port()
        webhook_certs = self.dir / "kueue-webhook-certs"
        webhook_certs.mkdir(exist_ok=True)
        (webhook_certs / "tls.crt").write_bytes((certs / "webhook.crt").read_bytes())
        (webhook_certs / "tls.key").write_bytes((certs / "webhook.key").read_bytes())
        config = json.loads(json.dumps(self.kueue_config))
        config["health"] = {**config.get("health", {}), "healthProbeBindAddress": f"127.0.0.1:{health_port}"}
        config["metrics"] = {**config.get("metrics", {}), "bindAddress": f"127.0.0.1:{metrics_port}"}
        config["webhook"] = {**config.get("webhook", {}), "port": webhook_port, "host": "127.0.0.1",
                             "certDir": str(webhook_certs)}
        config["leaderElection"] = {**config.get("leaderElection", {}), "leaderElect": False}
        config["internalCertManagement"] = {"enable": False}
        (self.dir / "kueue-config.yaml").write_text(yaml.safe_dump(config))
        _metrics_certs(certs)
        self.kueue_effective_config = config

        self.apply_files(sorted((TOOLS / "kueue-crds").glob("*.yaml")))
        self.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
        self.kubectl("create", "namespace", "kueue-system")
        self.apply_objects(webhook_configurations(webhook_port, certs / "ca.crt"))
        self._start("kueue", [f"--config={self.dir / 'kueue-config.yaml'}", f"--kubeconfig={self.kubeconfig}",
                              "--feature-gates=VisibilityOnDemand=false", "--zap-log-level=2"],
                    env={"KUBECONFIG": str(self.kubeconfig), "POD_NAMESPACE": "kueue-system"})
        self._wait("kueue", lambda: _get(f"http://127.0.0.1:{health_port}/readyz") == "ok", timeout_s=120)

    # --- the MPI operator, as the stack installs it -------------------------------------------------------------
    def install_mpi_crd(self) -> None:
        """The MPIJob CRD of the release the operator is built from (the file the stack's ConfigFile fetches);
        server-side, as upstream says to apply it: client-side apply's annotation would exceed its size limit."""
        self.apply_files(sorted((TOOLS / "mpi-operator-crds").glob("*.yaml")))
        # Polled: `kubectl wait` on a CRD whose status the apiserver has not written yet fails at once
        # ("status.conditions accessor error") instead of waiting.
        deadline = time.monotonic() + 60
        while not any(c.get("type") == "Established" and c.get("status") == "True" for c in
                      (self.get("crd", "mpijobs.kubeflow.org").get("status") or {}).get("conditions") or []):
            if time.monotonic() > deadline:
                raise ControlPlaneError("the MPIJob CRD is not Established after 60 s")
            time.sleep(0.5)

    @contextlib.contextmanager
    def mpi_operator(self, lock_namespace: str) -> Iterator[None]:
        """The controller with the arguments of the stack's Deployment, ready once it holds its leader lease, for
        the block only. One per machine at a time: its health server listens on port 8080, which no flag
        changes (mpi-operator v0.8.2 cmd/mpi-operator/app/server.go; taken, it exits), and every stack's cluster
        may be running at once on `make e2e`'s workers: the block holds a machine-wide lock."""
        with open(MPI_OPERATOR_LOCK, "w") as lock:
            deadline = time.monotonic() + 600
            while True:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise ControlPlaneError(f"another run has held {MPI_OPERATOR_LOCK} for 600 s")
                    time.sleep(1)
            try:
                self._start("mpi-operator", [f"--kubeConfig={self.kubeconfig}", "-alsologtostderr",
                                             f"--lock-namespace={lock_namespace}"])
                self._wait("mpi-operator", lambda: self.get("leases", namespace=lock_namespace)["items"],
                           timeout_s=60)
                yield
            finally:
                self._stop("mpi-operator")       # before the lock goes: the port with it

    def _stop(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        _reap(proc, 10)

    def start_slurm_operator(self, restapi_on_localhost: bool = False) -> None:
        """Slinky's operator (its manager; the optional webhook, which needs cert-manager, is left out), with its
        metrics off and its health server on a free port; ready once it says so. `restapi_on_localhost`: it
        reaches slurmrestd at localhost:6820 rather than through the RestApi's Service (its DEBUG=1,
        internal/controller/slurmclient/slurmclient_sync.go), where this machine's runs."""
        health = free_port()
        self._start("slurm-operator", ["--metrics-addr=0", f"--health-addr=127.0.0.1:{health}"],
                    env={"KUBECONFIG": str(self.kubeconfig), **({"DEBUG": "1"} if restapi_on_localhost else {})})
        self._wait("slurm-operator", lambda: _get(f"http://127.0.0.1:{health}/readyz") == "ok", timeout_s=60)

    # --- talking to it ---------------------------------------------------------------------------------------
    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([str(self.bin / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args],
                              input=input, capture_output=True, text=True, timeout=120)
        if check and proc.returncode != 0:
            raise ControlPlaneError(f"kubectl {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
        return proc

    def get(self, kind: str, name: str | None = None, namespace: str | None = None,
            selector: str | None = None, managed_fields: bool = False) -> Any:
        """What `kubectl get KIND [NAME] -o json` prints (`-A` for a list without a namespace), read from the API
        itself: the tests poll, and each kubectl process costs a fifth of a second of the CPU the control plane
        needs. kubectl's names (plural, singular, short, kind, each also with its group) are resolved through
        discovery; a name discovery does not know is left to kubectl. `managed_fields`: keep an object's
        metadata.managedFields (who applied which field)."""
        try:
            resource = self._resource(kind)
        except OSError as e:                     # the apiserver unreachable: as kubectl failing
            raise ControlPlaneError(f"get {kind}: discovery failed: {e}") from None
        if resource is None:
            args = ["get", kind, *([name] if name else []), "-o", "json"]
            args += ["-n", namespace] if namespace else (["-A"] if not name else [])
            args += ["-l", selector] if selector else []
            args += ["--show-managed-fields"] if managed_fields else []
            return json.loads(self.kubectl(*args).stdout)
        path = resource.prefix
        if resource.namespaced and (namespace or name):
            path += f"/namespaces/{namespace or 'default'}"
        path += f"/{resource.plural}" + (f"/{name}" if name else "")
        if selector:
            path += "?" + urllib.parse.urlencode({"labelSelector": selector})
        try:
            got = self._api(path)
        except urllib.error.HTTPError as e:
            raise ControlPlaneError(f"get {kind} {name or ''} failed ({e.code}):\n{e.read().decode()}") from None
        except OSError as e:
            raise ControlPlaneError(f"get {kind} {name or ''} failed: {e}") from None
        if name:
            return got if managed_fields else _shown(got)
        return {"apiVersion": "v1", "kind": "List",
                "items": [_shown({"apiVersion": resource.api_version, "kind": resource.kind, **item})
                          for item in got["items"]]}

    def _api(self, path: str) -> Any:
        if self._tls is None:
            certs = self.dir / "pki"
            self._tls = ssl.create_default_context(cafile=str(certs / "ca.crt"))
            self._tls.load_cert_chain(str(certs / "admin.crt"), str(certs / "admin.key"))
        with urllib.request.urlopen(self.server + path, timeout=30, context=self._tls) as r:  # noqa: S310
            return json.loads(r.read())

    def _resource(self, name: str) -> _Resource | None:
        """A resource as kubectl names it; discovery is read again once for a name it lacks (a CRD applied
        since)."""
        for fresh in (False, True):
            if fresh or self._resources is None:
                self._resources = self._discover()
            if name in self._resources:
                return self._resources[name]
        return None

    def _discover(self) -> dict[str, _Resource]:
        """Every served resource under each of kubectl's names for it, the core group's first and then the
        groups in the apiserver's order (as kubectl resolves a name two groups share), each group at its
        preferred version. A group the apiserver lists but does not serve yet (a CRD just created) is left out
        until the next discovery, which a name not found asks for."""
        out: dict[str, _Resource] = {}
        groups = [("", "v1", "/api/v1")] + [(g["name"], g["preferredVersion"]["groupVersion"],
                                             f"/apis/{g['preferredVersion']['groupVersion']}")
                                            for g in self._api("/apis")["groups"]]
        for group, version, prefix in groups:
            try:
                resources = self._api(prefix)["resources"]
            except urllib.error.HTTPError:      # a CRD's group listed before it is served: as kubectl, skipped
                continue
            for r in resources:
                if "/" in r["name"]:              # a subresource (pods/log)
                    continue
                entry = _Resource(prefix, r["name"], version, r["kind"], r["namespaced"])
                for n in {r["name"], r.get("singularName") or r["kind"].lower(), r["kind"].lower(),
                          *r.get("shortNames", [])}:
                    out.setdefault(n, entry)
                    if group:
                        out.setdefault(f"{n}.{group}", entry)
        return out

    def apply_objects(self, objects: Iterable[dict[str, Any]], dry_run: bool = False,
                      check: bool = True) -> subprocess.CompletedProcess[str]:
        text = yaml.safe_dump_all(list(objects), sort_keys=False)
        return self.kubectl("apply", "--server-side", "--field-manager=gpucluster-e2e", "--force-conflicts",
                            *(["--dry-run=server"] if dry_run else []), "-f", "-", input=text, check=check)

    def apply_files(self, paths: Iterable[Path]) -> None:
        for path in paths:
            self.kubectl("apply", "--server-side", "--field-manager=gpucluster-e2e", "-f", str(path))


# Kueue reads its metrics serving certificate from this fixed path whenever it does not manage certificates.
KUEUE_METRICS_CERTS = Path("/etc/kueue/metrics/certs")


def _metrics_certs(certs: Path) -> None:
    """Put a serving certificate where Kueue insists on finding one (read once at start; nothing scrapes it)."""
    if (KUEUE_METRICS_CERTS / "tls.crt").is_file() and (KUEUE_METRICS_CERTS / "tls.key").is_file():
        return
    try:
        KUEUE_METRICS_CERTS.mkdir(parents=True, exist_ok=True)
        (KUEUE_METRICS_CERTS / "tls.key").write_bytes((certs / "webhook.key").read_bytes())
        (KUEUE_METRICS_CERTS / "tls.crt").write_bytes((certs / "webhook.crt").read_bytes())
    except OSError as e:
        raise ControlPlaneError(f"Kueue needs a certificate in {KUEUE_METRICS_CERTS} and it cannot be written "
                                f"({e}); run the e2e tests as root or create it once") from None


# Kueue's CRDs are exempt from nothing; job and pod webhooks skip the system namespaces, as Kueue's kustomize does.
_SYSTEM_NAMESPACES = {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                                            "values": ["kube-system", "kueue-system"]}]}


def webhook_configurations(port: int, ca: Path) -> list[dict[str, Any]]:
    """Kueue's own webhook configurations (from its module), calling it by URL on loopback with our CA."""
    bundle = base64.b64encode(ca.read_bytes()).decode()
    out = []
    for path in sorted((TOOLS / "kueue-webhooks").glob("*.yaml")):
        for obj in yaml.safe_load_all(path.read_text()):
            if not obj or obj.get("kind") not in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
                continue
            obj["metadata"] = {"name": f"kueue-{obj['metadata']['name']}"}
            for hook in obj.get("webhooks", []):
                service = hook["clientConfig"].pop("service")
                hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{service['path']}", "caBundle": bundle}
                if not any("kueue.x-k8s.io" in r.get("apiGroups", []) for r in hook.get("rules", [])):
                    hook["namespaceSelector"] = _SYSTEM_NAMESPACES
            out.append(obj)
    if not out:
        raise ControlPlaneError(f"no webhook configurations in {TOOLS / 'kueue-webhooks'}; rerun `make e2e-tools`")
    return out


def _reap(proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    """Wait for a process told to stop; past `timeout_s`, kill its group."""
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)


def _alive(pid: int) -> bool:
    """The process group still has a member (a reaped leader with no children left counts as gone)."""
    try:
        os.killpg(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _shown(obj: dict[str, Any]) -> dict[str, Any]:
    """An object as kubectl prints it: without metadata.managedFields."""
    obj.get("metadata", {}).pop("managedFields", None)
    return obj


def _get(url: str, context: ssl.SSLContext | None = None) -> str:
    with urllib.request.urlopen(url, timeout=3, context=context) as r:   # noqa: S310 (loopback only)
        return r.read().decode()
