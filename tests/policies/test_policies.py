"""Every policy of the pack: the real stacks comply, and one changed fact per test gives the exact finding.

Policies run through the pulumi_policy SDK's own analyzer over what the real program registered offline
(`components/offline/policy.py`), as `pulumi preview --policy-pack policies` runs them.
"""

from __future__ import annotations

import json
import re

import pytest
import yaml
from pulumi_policy import EnforcementLevel

from components.offline.policy import LEVELS
from components.offline.runner import run_program
from tests.conftest import ROOT
from tests.policies.conftest import BY_NAME, POLICIES, _set, changed, findings, violations, with_resource, without

JOB = "kubernetes:batch/v1:Job"
QUEUE = "kueue.x-k8s.io/queue-name"


def job(namespace="team-a", labels=None, **pod):
    pod_spec = {"containers": [{"name": "main", "image": "registry.example/train:1",
                                "resources": {"limits": {"nvidia.com/gpu": 8}}}],
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}], **pod}
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "train", "namespace": namespace,
                         "labels": {QUEUE: "default"} if labels is None else labels},
            "spec": {"template": {"spec": pod_spec}}}


# --- the registry -------------------------------------------------------------------------------------------

DOMAINS = ("k8s", "tenancy", "fabric", "ssh", "secrets", "storage", "power", "ops")


def test_every_policy_is_named_described_and_configurable_with_defaults():
    assert len(BY_NAME) == len(POLICIES)
    for p in POLICIES:
        assert re.fullmatch(rf"(?:{'|'.join(DOMAINS)})(?:-[a-z0-9]+)+", p.name), p.name
        assert p.description.startswith("Checks that") and p.description.endswith(".") and \
            p.description.count(". ") == 0, p.name
        assert p.enforcement_level in (EnforcementLevel.MANDATORY, EnforcementLevel.ADVISORY), p.name
        for key, prop in (p.config_schema.properties if p.config_schema else {}).items():
            assert {"type", "default", "description"} <= set(prop), (p.name, key)


def test_every_policy_has_a_mutation_test():
    tested = {case[0] for case in CASES} | {"ssh-host-key-pinned", "k8s-job-templates-gpu-limits",
                                             "fabric-nccl-workload-settings",
                                             "fabric-leaf-nonblocking", "storage-servers-protected",
                                             "tenancy-prod-network-bounds", "k8s-images-from-mirror",
                                             "fabric-dedicated-pool-isolated", "fabric-no-foreign-partition"}
    assert tested == set(BY_NAME)


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_the_prod_stack_complies(name, prod_run):
    assert findings(prod_run, name) == []


@pytest.mark.parametrize("name", sorted(set(BY_NAME) - {"ssh-host-key-pinned"}))
def test_the_dev_stack_complies(name, dev_run):
    assert findings(dev_run, name) == []


# --- one change, one finding ----------------------------------------------------------------------------------

LEAF = ["data_plane", "switches", "leaf-dev-01"]
OST = ["spec", "servers", 0, "targets", 2]          # stor-dev-01's storage target 101

_MOVES = ("a tag that moves: nodes pull whatever it names that day, so a rollout or a rescheduled pod runs another "
          "build; pin a version tag or a digest")


def _spec_field(path, value):
    """An edit of a cluster's registered spec (its output spec_json, one JSON text)."""
    def edit(outputs):
        spec = json.loads(outputs["spec_json"])
        _set(path, value)(spec)
        outputs["spec_json"] = json.dumps(spec)
    return edit


CASES = [
    ("k8s-image-versions-pinned", lambda r: with_resource(r, JOB, "train", job(containers=[
        {"name": "main", "image": "registry.example/train"}, {"name": "side", "image": "busybox:latest"},
        {"name": "digest", "image": "busybox@sha256:" + "a" * 64}, {"name": "port", "image": "localhost:5000/x:1"}])),
     [f"Job train: container main's image registry.example/train is untagged (pulled as :latest), {_MOVES}",
      f"Job train: container side's image busybox:latest is tagged :latest, {_MOVES}"]),
    ("k8s-image-versions-pinned", lambda r: changed(r, "dev", _spec_field(
        ["validation", "dcgm_image"], "nvcr.io/nvidia/cloud-native/dcgm:latest")),
     [f"the spec's validation.dcgm_image: image nvcr.io/nvidia/cloud-native/dcgm:latest is tagged :latest, {_MOVES}"]),
    ("k8s-helm-chart-pinned", lambda r: with_resource(r, "kubernetes:helm.sh/v4:Chart", "extra",
                                                      {"chart": "oci://registry.example/charts/extra"}),
     ["Helm chart extra (chart oci://registry.example/charts/extra) pins no chart version, so each update may install "
      "a newer chart; set version to an exact release"]),
    ("k8s-gpu-limits", lambda r: with_resource(r, JOB, "train", job(containers=[
        {"name": "main", "image": "x", "resources": {"requests": {"nvidia.com/gpu": 8}}}])),
     ["Job train: container main requests nvidia.com/gpu without a limit; GPUs are allocated by limit: set "
      "resources.limits['nvidia.com/gpu']"]),
    ("k8s-gpu-limits", lambda r: with_resource(r, JOB, "train", job(containers=[
        {"name": "main", "image": "x", "resources": {"requests": {"nvidia.com/gpu": 8},
                                                     "limits": {"nvidia.com/gpu": 4}}}])),
     ["Job train: container main requests 8 nvidia.com/gpu but limits 4; extended resources cannot be "
      "overcommitted: make them equal"]),
    ("k8s-tenant-queue-name", lambda r: with_resource(r, JOB, "train", job(labels={})),
     ["Job team-a/train has no kueue.x-k8s.io/queue-name label, so Kueue neither admits nor counts it against the "
      "tenant's quota; label it with the tenant's LocalQueue"]),
    ("k8s-tenant-queue-name", lambda r: with_resource(r, JOB, "train", job(labels={QUEUE: "team-b"})),
     ["Job team-a/train names LocalQueue 'team-b', which this stack does not create in team-a; use the tenant's "
      "LocalQueue"]),
    ("k8s-no-host-access", lambda r: with_resource(r, JOB, "train", job(
        hostNetwork=True, volumes=[{"name": "data", "hostPath": {"path": "/mnt/devfs"}}])),
     ["Job team-a/train has hostNetwork: true, hostPath volume data outside the system namespaces; only the "
      "platform's agents get host access (mount storage through a PersistentVolumeClaim; Pod Security restricted "
      "lets a container add NET_BIND_SERVICE alone)"]),
    ("k8s-helm-chart-pinned", lambda r: changed(r, "dev-k8s-kueue", _set(["version"], "0.19")),
     ["Helm release kueue (chart oci://registry.k8s.io/kueue/charts/kueue) asks for version '0.19', not an exact "
      "release; pin one such as 1.2.3"]),
    ("k8s-helm-chart-pinned", lambda r: changed(r, "dev-k8s-kueue", lambda i: i.pop("version")),
     ["Helm release kueue (chart oci://registry.k8s.io/kueue/charts/kueue) pins no chart version, so each update "
      "may install a newer chart; set version to an exact release"]),
    ("k8s-known-good-versions", lambda r: changed(r, "dev-k8s", _set(["known_good_versions"], False)),
     ["dev-k8s installs gpu_operator v26.7.0, network_operator 26.4.1, kueue 0.19.2, nfd 0.19.0, which are not a "
      "known-good combination (allowed by kubernetes.allow_unknown_versions); use a known-good combination"]),
    ("tenancy-no-cluster-admin",
     lambda r: changed(r, "dev-team-a-rb-admin", _set(["roleRef", "name"], "cluster-admin")),
     ["dev-team-a-rb-admin binds cluster-admin to oidc:ml-platform-admins; bind admin, edit or view instead"]),
    ("tenancy-namespace-restricted", lambda r: changed(
        r, "dev-team-b-ns", _set(["metadata", "labels", "pod-security.kubernetes.io/enforce"], "baseline")),
     ["tenant namespace team-b enforces Pod Security level baseline; tenant namespaces enforce restricted"]),
    ("tenancy-clusterqueue-namespace-selector",
     lambda r: changed(r, "dev-team-a-cq", _set(["spec", "namespaceSelector"], {})),
     ["dev-team-a-cq selects every namespace, so any tenant can use its quota; select the tenant's namespace"]),
    ("tenancy-local-queue", lambda r: changed(r, "dev-team-a-lq", _set(["metadata", "namespace"], "team-b")),
     ["tenant namespace team-a has no Kueue LocalQueue, so its jobs cannot be admitted; create one pointing at the "
      "tenant's ClusterQueue"]),
    ("tenancy-no-wildcard-verbs", lambda r: with_role_granted(
        r, "power", [{"apiGroups": [""], "resources": ["pods"], "verbs": ["*"]}]),
     ["dev-team-a-rb-admin grants Role power in tenant namespace team-a, whose rules use '*' in verbs; list the verbs "
      "and resources the tenant needs"]),
    ("tenancy-default-deny", lambda r: changed(r, "dev-team-a-np-deny", _set(["spec", "policyTypes"], ["Ingress"])),
     ["tenant namespace team-a has no default-deny NetworkPolicy (empty podSelector, Ingress and Egress, no rules); "
      "add one so only explicit allows pass"]),
    ("tenancy-clusterqueue-one-tenant", lambda r: changed(r, "dev-team-a-cq", _set(
        ["spec", "namespaceSelector"], {"matchExpressions": [{"key": "gpucluster.io/tenant", "operator": "Exists"}]})),
     ["dev-team-a-cq selects the namespaces of 2 tenants (team-a, team-b), so each can spend the others' quota; "
      "select one tenant's namespace"]),
    ("tenancy-clusterqueue-one-tenant", lambda r: changed(r, "dev-team-b-cq", _set(
        ["spec", "namespaceSelector"], {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In",
                                                              "values": ["team-a", "team-b"]}]})),
     ["dev-team-b-cq selects the namespaces of 2 tenants (team-a, team-b), so each can spend the others' quota; "
      "select one tenant's namespace"]),
    ("tenancy-clusterqueue-gpu-quota", lambda r: changed(r, "dev-team-a-cq", _set(
        ["spec", "resourceGroups", 0, "coveredResources"], ["cpu", "memory"])),
     ["dev-team-a-cq gives quota on GPU pool flavor(s) h100 but covers no GPU resource (cpu, memory), so none of "
      "its GPU jobs is ever admitted there; cover nvidia.com/gpu (or the pool's shared resource) with the tenant's "
      "quota"]),
    ("tenancy-no-open-network-policy", lambda r: changed(r, "dev-team-a-np-same-ns", _set(["spec", "ingress"], [{}])),
     ["dev-team-a-np-same-ns in tenant namespace team-a has an ingress rule with no peers, which allows traffic "
      "from every pod, namespace and address; name the peers it needs"]),
    ("tenancy-no-open-network-policy", lambda r: changed(r, "dev-team-a-np-dns", _set(
        ["spec", "egress", 0, "to"], [])),
     ["dev-team-a-np-dns in tenant namespace team-a has an egress rule with no peers, which allows traffic to every "
      "pod, namespace and address; name the peers it needs"]),
    ("tenancy-no-open-network-policy", lambda r: changed(r, "dev-team-b-np-same-ns", _set(
        ["spec", "egress"], [{"to": [{"namespaceSelector": {}, "podSelector": {}}], "ports": [{"port": 443}]}])),
     ["dev-team-b-np-same-ns in tenant namespace team-b allows egress to pods of every namespace (an empty "
      "namespaceSelector), other tenants' included; select the namespaces by name"]),
    ("fabric-pfc-single-priority", lambda r: changed(
        r, "dev-fabric", _set([*LEAF, "pfc_priorities"], [3, 4])),
     ["switch leaf-dev-01 have PFC on priorities 3, 4 but RoCE uses priority 3; enable PFC on exactly that one "
      "priority"]),
    ("fabric-pfc-single-priority", lambda r: changed(
        r, "dev-fabric", _set(["data_plane", "storage_servers", "pfc_priorities"], [])),
     ["the storage servers have PFC on priorities none but RoCE uses priority 3; enable PFC on exactly that one "
      "priority"]),
    ("fabric-mtu-consistent", lambda r: changed(r, "dev-fabric", _set(["data_plane", "storage_servers", "mtu_bytes"],
                                                                     1500)),
     ["hosts of the data plane use different MTUs (h100: 9000, storage servers: 1500); use one MTU on every host"]),
    ("fabric-qos-consistent", lambda r: changed(r, "dev-fabric", _set([*LEAF, "dscp"], 24)),
     ["switch leaf-dev-01 use RoCE dscp 24 but pool h100's hosts use 26; one dscp on every host and switch"]),
    ("fabric-qos-consistent", lambda r: changed(r, "dev-team-b-nccl-h100", _set(["data", "NCCL_IB_TC"], "96")),
     ["ConfigMap team-b/nccl-h100 set NCCL_IB_TC=96 (DSCP 24) but hosts and switches carry RoCE on DSCP 26; set "
      "NCCL_IB_TC=106"]),
    ("fabric-mtu-consistent", lambda r: changed(r, "dev-fabric", _set([*LEAF, "mtu_bytes"], 4200)),
     ["switch leaf-dev-01 has MTU 4200, below the hosts' 9000: it drops their largest frames; give every switch at "
      "least the hosts' MTU"]),
    ("fabric-nccl-hca-exact",
     lambda r: changed(r, "dev-fabric", _set(["nccl_env", "h100", "NCCL_IB_HCA"], "mlx5_0,mlx5_1")),
     ["the fabric's NCCL settings of pool h100 set NCCL_IB_HCA=mlx5_0,mlx5_1, a prefix match (mlx5_1 also matches "
      "mlx5_10 and up); put '=' before the names for exact matches: NCCL_IB_HCA==mlx5_0,mlx5_1"]),
    ("fabric-nccl-hca-exact",
     lambda r: changed(r, "dev-fabric", _set(["nccl_env", "h100", "NCCL_IB_HCA"], "^mlx5_2")),
     ["the fabric's NCCL settings of pool h100 set NCCL_IB_HCA=^mlx5_2, a prefix match (mlx5_1 also matches "
      "mlx5_10 and up); put '=' before the names for exact matches: NCCL_IB_HCA=^=mlx5_2"]),
    ("fabric-leaf-oversubscription", lambda r: changed(r, "dev-fabric", _set(
        ["topology", "leaves", "leaf-dev-01"], {"down_gbps": 1600, "up_gbps": 400, "oversubscription": 4,
                                               "pools": ["h100"]})),
     ["leaf leaf-dev-01 is oversubscribed 4:1 (1600 Gb/s down, 400 Gb/s up) and serves training pool(s) h100; add "
      "uplinks or spread the hosts for at most 2:1"]),
    ("secrets-no-key-material", lambda r: changed(r, "dev-team-a-nccl-h100", _set(
        ["data", "KEY"], "-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn\n-----END OPENSSH PRIVATE KEY-----")),
     ["carries a private key in data.KEY, where it ends up in plan files, state and logs; pass keys only as an SSH "
      "connection's privateKey from a Pulumi secret, or in a Kubernetes Secret's data"]),
    ("storage-no-reformat", lambda r: changed(changed(r, "dev", _set(["environment"], "staging")), "dev-storage",
                                              _set([*OST, "reformat"], True)),
     ["stor-dev-01 target /dev/disk/by-id/nvme-stor101 sets reformat in staging environment: a run would erase the "
      "data on it; remove reformat (allowed in dev)"]),
    ("storage-raid-redundancy", lambda r: changed(r, "dev-storage", _set([*OST, "raid_level"], "raid5")),
     ["stor-dev-01 storage target /dev/disk/by-id/nvme-stor101 is on raid5; use raid1 or raid6 or raid10 or raidz2 "
      "(RAID-6 survives two failed disks, and a rebuild of a large RAID-5 often meets a second)"]),
    ("storage-bandwidth-per-gpu", lambda r: changed(r, "dev-storage", _set(["read_gb_per_s_per_gpu"], 0.1)),
     ["dev-storage reads 20 GB/s for 16 GPUs, 0.1 GB/s per GPU, below the target 0.15; add storage servers (or "
      "correct read_gb_per_s_per_server)"]),
    ("storage-bandwidth-per-gpu", lambda r: changed(changed(r, "dev-storage", _set(["read_gb_per_s_per_gpu"], 0.1)),
                                                    "dev-storage", _set(["spec", "kind"], "wekafs")),
     ["dev-storage reads 20 GB/s for 16 GPUs, 0.1 GB/s per GPU, below the target 0.15; grow the site's cluster (or "
      "correct storage.weka.read_gb_per_s)"]),
    ("power-rack-budget", lambda r: changed(r, "dev", _set(["racks", "r01", "pdu_capacity_kw"], 25)),
     ["rack r01 draws up to 2 x 10.2 kW (h100 host) + 1 x 1.5 kW (leaf switch) + 1 x 1.5 kW (storage server) = "
      "23.4 kW at peak (GPUs at TDP plus base power, storage servers, switches), over its budget of 25 kW x 80% = "
      "20 kW; move hosts to another rack or add PDU capacity"]),
    ("power-rack-budget", lambda r: changed(r, "dev", _set(["racks", "r01", "unknown"], ["storage server"])),
     ["rack r01's power cannot be checked: no power figure for storage server (host_base_power_w or host_model, "
      "power_w); its known load is 23.4 kW of a 27.2 kW budget"]),
    ("power-rack-budget", lambda r: changed(r, "dev", _set(["racks", "r01", "pdu_redundancy"], None)),
     ["rack r01's pdu_redundancy is not stated: is its 34 kW one feed of an A+B pair or all its PDUs? Set "
      "pdu_redundancy (a+b or none)"]),
    ("ops-gpu-temperature-alert", lambda r: changed(r, "dev-k8s-gpu-alerts", _set(
        ["spec", "groups", 0, "rules", 0, "expr"], "max by (Hostname, gpu) (DCGM_FI_DEV_GPU_TEMP) > 92")),
     ["alert GpuTemperatureHigh fires above 92 C, later than 85 C, when GPUs already throttle; set "
      "kubernetes.monitoring.gpu_temperature_limit_c to at most 85"]),
    ("ops-gpu-temperature-alert", lambda r: changed(changed(r, "dev", _set(["environment"], "prod")),
                                                    "dev-k8s-gpu-alerts", _set(["spec", "groups", 0, "rules", 0, "expr"],
                                                                               "max by (Hostname, gpu) (DCGM_FI_DEV_GPU_TEMP) > 40")),
     ["alert GpuTemperatureHigh fires above 40 C, below the 75 C a busy GPU reaches within NVIDIA's limits, so it "
      "fires on every busy node in prod; set kubernetes.monitoring.gpu_temperature_limit_c to 75-85"]),
    ("ops-rollout-bounded", lambda r: changed(changed(r, "dev", _set(["environment"], "prod")), "dev-h100",
                                              _set(["spec", "pool", "rollout", "max_unavailable"], "100%")),
     ["node pool h100 rolls all 2 hosts in one batch (rollout.max_unavailable 100%) in prod: a disruptive change "
      "stops every job on the pool at once; set a share such as '25%'"]),
    ("ops-rollout-bounded", lambda r: changed(changed(r, "dev", _set(["environment"], "prod")), "dev-h100",
                                              _set(["spec", "pool", "rollout", "max_unavailable"], 2)),
     ["node pool h100 rolls all 2 hosts in one batch (rollout.max_unavailable 2) in prod: a disruptive change "
      "stops every job on the pool at once; set a share such as '25%'"]),
    ("ops-burn-in-enabled", lambda r: changed(changed(r, "dev", _set(["environment"], "prod")), "dev-h100",
                                              _set(["spec", "pool", "burn_in", "enabled"], False)),
     ["node pool h100 skips burn-in in prod, so a node with a bad GPU, NIC or cable takes production work; set "
      "burn_in.enabled: true"]),
    ("ops-gpu-quarantine-enforced", lambda r: changed(r, "dev", _set(["environment"], "prod")),
     ["its GPU quarantine rules gpucluster-gpu-evict, gpucluster-gpu-health only preview (dry run) in prod, so a "
      "node whose GPU faults after burn-in keeps taking jobs; set kubernetes.health.quarantine.mode: enforce (with "
      "kubernetes.health.enabled)"]),
    ("ops-gpu-quarantine-enforced", lambda r: without(without(changed(r, "dev", _set(["environment"], "prod")),
                                                              "dev-k8s-quarantine-rule"), "dev-k8s-evict-rule"),
     ["no NodeReadinessRule acts on GpuHardwareFault in prod, so a node whose GPU faults after burn-in keeps taking "
      "jobs; set kubernetes.health.quarantine.mode: enforce (with kubernetes.health.enabled)"]),
    ("ops-driver-cuda-nccl-compatible", lambda r: changed(r, "dev-h100", _set(["spec", "pool", "software"], {
        "driver_version": "520.61.05", "cuda_version": "12.4", "nccl_version": "2.21.5"})),
     ["node pool h100 runs driver 520.61.05 but its images are built for CUDA 12.4, which needs driver 525.60.13 or "
      "newer (NVIDIA's CUDA compatibility table): CUDA would not initialize; upgrade software.driver_version"]),
    ("ops-driver-cuda-nccl-compatible", lambda r: changed(r, "dev-h100", _set(["spec", "pool", "software"], {
        "driver_version": "575.57.08", "cuda_version": "13.0.1", "nccl_version": "2.26.2-1"})),
     ["node pool h100 runs driver 575.57.08 but its images are built for CUDA 13.0.1, which needs driver 580.65.06 "
      "or newer (NVIDIA's CUDA compatibility table): CUDA would not initialize; upgrade software.driver_version",
      "node pool h100 states NCCL 2.26.2-1 with CUDA 13.0.1, but the first NCCL built for CUDA 13 is 2.27.7: the "
      "images cannot carry that pair; correct software.nccl_version or cuda_version"]),
    ("tenancy-dedicated-flavor-owner", lambda r: changed(r, "dev-h100", _set(["spec", "pool", "dedicated_to"],
                                                                               "team-a")),
     [f"{q} names the flavor of pool h100, which is dedicated to tenant team-a, but serves {who}: it can borrow that "
      "tenant's GPUs and its pods run on that tenant's nodes; remove the flavor, or state why on the queue "
      "(gpucluster.io/isolation-exception)" for q, who in (("dev-k8s-health-check-queue", "no tenant"),
                                                           ("dev-team-b-cq", "team-b"))]),
    ("ops-uniform-software", lambda r: with_pool_copy(r, "570.124.06", "550.54.15"),
     ["training pools run different driver versions (550.54.15 on h100; 570.124.06 on h200); jobs spanning pools "
      "fail or slow down on mismatched driver: use one version, or set software.allow_version_skew on a canary "
      "pool"]),
    ("ops-uniform-software-all-pools", lambda r: with_pool_copy(r, "570.124.06", "550.54.15", workload="inference"),
     ["node pools run different driver versions (550.54.15 on h100; 570.124.06 on h200); pools that never share a "
      "job may, but one version is one set of known issues: align them when you can"]),
    ("tenancy-no-escalating-verbs", lambda r: with_role_granted(
        r, "granter", [{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles", "rolebindings"],
                        "verbs": ["get", "bind", "escalate"]}]),
     ["dev-team-a-rb-admin grants Role granter in tenant namespace team-a, which allows bind, escalate: whoever "
      "holds it can grant themselves more than it; drop those verbs"]),
    ("tenancy-no-cluster-wide-tenant-grants", lambda r: with_resource(
        r, "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding", "team-a-everywhere",
        {"metadata": {"name": "team-a-everywhere"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "oidc:team-a"}]}),
     ["team-a-everywhere binds Group oidc:team-a, a tenant's identity, to ClusterRole edit in every namespace, other "
      "tenants' included; bind it with a RoleBinding in the tenant's namespace"]),
    ("tenancy-no-wildcard-verbs", lambda r: with_resource(with_resource(
        r, "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole", "all",
        {"metadata": {"name": "all"}, "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["get"]}]}),
        "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding", "ci-reads-all",
        {"metadata": {"name": "ci-reads-all"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "all"},
         "subjects": [{"kind": "User", "name": "ci-bot"}]}),
     ["ci-reads-all grants ClusterRole all cluster-wide, whose rules use '*' in apiGroups, resources; list the verbs "
      "and resources the tenant needs"]),
    ("k8s-no-host-access", lambda r: with_resource(r, JOB, "train", job(containers=[
        {"name": "main", "image": "x", "securityContext": {"capabilities": {"add": ["NET_BIND_SERVICE", "SYS_ADMIN"]}}}
    ])),
     ["Job team-a/train has container main adding capabilities SYS_ADMIN outside the system namespaces; only the "
      "platform's agents get host access (mount storage through a PersistentVolumeClaim; Pod Security restricted "
      "lets a container add NET_BIND_SERVICE alone)"]),
    ("k8s-no-host-access", lambda r: with_resource(r, JOB, "debug", job(namespace="default", hostPID=True)),
     ["Job default/train has hostPID: true outside the system namespaces; only the platform's agents get host "
      "access (mount storage through a PersistentVolumeClaim; Pod Security restricted lets a container add "
      "NET_BIND_SERVICE alone)"]),
]


def with_role_granted(run, role, rules):
    """team-a's admin binding pointed at a Role of the tenant's namespace with `rules`."""
    bound = changed(run, "dev-team-a-rb-admin", _set(["roleRef"], {"apiGroup": "rbac.authorization.k8s.io",
                                                                   "kind": "Role", "name": role}))
    return with_resource(bound, "kubernetes:rbac.authorization.k8s.io/v1:Role", role,
                         {"metadata": {"name": role, "namespace": "team-a"}, "rules": rules})


def with_pool_copy(run, first, second, workload="training"):
    """A second pool beside the dev pool, each with its own driver version."""
    import copy
    out = changed(run, "dev-h100", _set(["spec", "pool", "software"], {"driver_version": second}))
    record = next(r for r in out.records if r.name == "dev-h100")
    twin = copy.deepcopy(record)
    twin.name, twin.urn = "dev-h200", record.urn.replace("::dev-h100", "::dev-h200")
    out.records.append(twin)
    outputs = copy.deepcopy(out.component_outputs[record.urn])
    outputs["spec"]["pool"].update(name="h200", software={"driver_version": first}, workload=workload)
    out.component_outputs[twin.urn] = outputs
    return out


@pytest.mark.parametrize("policy,mutate,expected", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_one_changed_fact_gives_the_exact_finding(policy, mutate, expected, dev_run):
    assert findings(mutate(dev_run), policy) == expected


def _opened(run, env):
    """team-a's same-namespace policy opened to the internet and to team-b (prod has a team-b too)."""
    return changed(run, f"{env}-team-a-np-same-ns", _set(["spec"], {
        "podSelector": {}, "policyTypes": ["Ingress", "Egress"],
        "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "team-b"}}}]}],
        "egress": [{"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8"]}}]}]}))


def test_in_prod_a_tenant_reaches_no_other_tenant_and_not_every_address(prod_run, dev_run):
    assert findings(_opened(prod_run, "prod"), "tenancy-prod-network-bounds") == [
        "prod-team-a-np-same-ns lets tenant team-a's pods reach every address (0.0.0.0/0); in prod list the "
        "networks they need (tenants[].allow_egress_cidrs)",
        "prod-team-a-np-same-ns lets tenant(s) team-b reach tenant team-a's pods; in prod tenants do not reach "
        "each other (tenants[].allow_ingress_from_namespaces)"]
    assert findings(_opened(dev_run, "dev"), "tenancy-prod-network-bounds") == []


def test_the_health_checks_namespace_is_the_platforms_not_a_tenants(dev_run):
    """It carries the tenant label for Kueue and is privileged for its hostPath; it is a system namespace of the
    stack, so tenant policies leave it alone, and only that makes them do so."""
    for name in ("tenancy-namespace-restricted", "tenancy-local-queue", "tenancy-clusterqueue-one-tenant",
                 "k8s-no-host-access"):
        assert findings(dev_run, name) == [], name
    run = changed(dev_run, "dev", lambda o: o["system_namespaces"].remove("gpu-health-checks"))
    assert findings(run, "tenancy-namespace-restricted") == [
        "tenant namespace gpu-health-checks enforces Pod Security level privileged; tenant namespaces enforce "
        "restricted"]


def test_a_compliant_hand_written_job_passes_every_workload_policy(dev_run):
    run = with_resource(dev_run, JOB, "train", job())
    for name in ("k8s-gpu-limits", "k8s-tenant-queue-name", "k8s-no-host-access"):
        assert findings(run, name) == [], name


def test_an_inference_pool_may_run_another_driver_than_the_training_pools(dev_run):
    run = with_pool_copy(dev_run, "570.124.06", "550.54.15", workload="inference")
    assert findings(run, "ops-uniform-software") == []
    assert [v.level for v in violations(run, "ops-uniform-software-all-pools")] == ["advisory"]


def test_an_exact_exclude_list_is_not_a_prefix_match(dev_run):
    run = changed(dev_run, "dev-fabric", _set(["nccl_env", "h100", "NCCL_IB_HCA"], "^=mlx5_2"))
    assert findings(run, "fabric-nccl-hca-exact") == []


def test_a_skewed_pool_that_opts_out_is_left_alone(dev_run):
    run = with_pool_copy(dev_run, "570.124.06", "550.54.15")
    record = next(r for r in run.records if r.name == "dev-h200")
    run.component_outputs[record.urn]["spec"]["pool"]["software"]["allow_version_skew"] = True
    assert findings(run, "ops-uniform-software") == []


def test_an_unpinned_host_is_reported_per_command(prod_run):
    run = changed(prod_run, "prod-storage-oss-01", lambda i: i["connection"]["value"].pop("hostKey"))
    found = violations(run, "ssh-host-key-pinned")
    assert [(v.resource, v.level, v.message) for v in found] == [
        ("prod-storage-oss-01", "mandatory", "connects to 10.20.0.41 without a pinned host key, so anyone answering "
         "on that address gets the script (and sudo); set host_key for that host or switch in the spec")]


def test_a_copy_of_scripts_to_an_unpinned_host_is_reported_too(prod_run):
    """The pool's shared script parts reach the host by their own SFTP session, and root runs them later."""
    run = changed(prod_run, "prod-h100-gpu-prod-02-scripts", lambda i: i["connection"]["value"].pop("hostKey"))
    assert [(v.resource, v.level) for v in violations(run, "ssh-host-key-pinned")] == [
        ("prod-h100-gpu-prod-02-scripts", "mandatory")]


def test_an_unprotected_storage_server_is_reported(prod_run):
    run = copy_with_options(prod_run, "prod-storage-oss-02", protect=False)
    assert findings(run, "storage-servers-protected") == [
        "prod-storage-oss-02 sets up storage server oss-02 but is not protected, so a destroy or a replacement runs "
        "its delete; protect it"]


def copy_with_options(run, name, **options):
    import copy
    out = copy.deepcopy(run)
    next(r for r in out.records if r.name == name).options.update(options)
    return out


def test_a_job_template_without_gpu_limits_is_reported(dev_run):
    def drop_limits(outputs):
        outputs["checks"]["nccl-h100.yaml"] = outputs["checks"]["nccl-h100.yaml"].replace(
            "limits:\n                nvidia.com/gpu", "requests:\n                nvidia.com/gpu")
    found = findings(changed(dev_run, "dev-fabric", drop_limits), "k8s-job-templates-gpu-limits")
    assert found == ["job template nccl-h100.yaml (MPIJob Worker nccl-check-h100): container worker requests "
                     "nvidia.com/gpu without a limit; GPUs are allocated by limit: set "
                     "resources.limits['nvidia.com/gpu']"]


def test_a_blocking_leaf_is_advisory_and_a_threshold_is_set_per_stack(dev_run):
    run = changed(dev_run, "dev-fabric", _set(["topology", "leaves", "leaf-dev-01"], {
        "down_gbps": 1600, "up_gbps": 1200, "oversubscription": 1.333, "pools": ["h100"]}))
    assert findings(run, "fabric-leaf-oversubscription") == []
    [v] = violations(run, "fabric-leaf-nonblocking")
    assert v.level == "advisory" and v.message.startswith("leaf leaf-dev-01 is oversubscribed 1.333:1")
    strict = {"fabric-leaf-oversubscription": (LEVELS["mandatory"], {"maxRatio": 1.2})}
    assert findings(run, "fabric-leaf-oversubscription", strict)[0].endswith("at most 1.2:1")


def test_an_inference_pool_may_sit_behind_an_oversubscribed_leaf(dev_run):
    run = changed(dev_run, "dev-fabric", _set(["topology", "leaves", "leaf-dev-01"], {
        "down_gbps": 1600, "up_gbps": 400, "oversubscription": 4, "pools": ["h100"]}))
    run = changed(run, "dev-h100", _set(["spec", "pool", "workload"], "inference"))
    assert findings(run, "fabric-leaf-oversubscription") == []


# --- values not known until apply ----------------------------------------------------------------------------

def test_a_value_unknown_during_preview_is_an_advisory_note_not_a_crash(dev_run):
    import pulumi
    run = changed(dev_run, "dev-fabric", _set(["data_plane"], pulumi.output.Unknown()))
    [v] = violations(run, "fabric-mtu-consistent")
    assert v.level == "advisory"
    assert v.message == ("can't run policy 'fabric-mtu-consistent' from policy pack 'gpucluster@v0.1.0' during "
                         "preview: string value at .data_plane can't be known during preview")


def test_unknown_strings_are_skipped_when_looking_for_key_material(dev_run):
    import pulumi
    run = changed(dev_run, "dev-team-a-nccl-h100", _set(["data", "NCCL_IB_HCA"], pulumi.output.Unknown()))
    assert findings(run, "secrets-no-key-material") == []


# --- key material in every format tools write (issue 31, class 9) and where it may be (class 10) ---------------

SECRET = "kubernetes:core/v1:Secret"
CONFIG_MAP = "kubernetes:core/v1:ConfigMap"
_BODY = "\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7\n"
KEYS = {
    "pkcs1-rsa": f"-----BEGIN RSA PRIVATE KEY-----{_BODY}-----END RSA PRIVATE KEY-----\n",
    "sec1-ec": f"-----BEGIN EC PRIVATE KEY-----{_BODY}-----END EC PRIVATE KEY-----\n",
    "pkcs8": f"-----BEGIN PRIVATE KEY-----{_BODY}-----END PRIVATE KEY-----\n",
    "pkcs8-encrypted": f"-----BEGIN ENCRYPTED PRIVATE KEY-----{_BODY}-----END ENCRYPTED PRIVATE KEY-----\n",
    "openpgp": "-----BEGIN PGP PRIVATE KEY BLOCK-----\n\nlQOYBF1234\n-----END PGP PRIVATE KEY BLOCK-----\n",
    "putty": "PuTTY-User-Key-File-3: ssh-ed25519\nEncryption: none\nPrivate-Lines: 1\nAAAA\n",
    "gcp-service-account": '{"type": "service_account", "private_key": "-----BEGIN PRIVATE KEY-----\\nMIIE\\n"}',
}


def _b64(text: str, lead: str = "") -> str:
    import base64
    return base64.b64encode((lead + text).encode()).decode()


@pytest.mark.parametrize("fmt", sorted(KEYS))
def test_a_private_key_in_any_format_in_a_config_map_is_a_leak(dev_run, fmt):
    run = with_resource(dev_run, CONFIG_MAP, "creds", {"apiVersion": "v1", "kind": "ConfigMap",
                                                       "metadata": {"name": "creds", "namespace": "team-a"},
                                                       "data": {"key": KEYS[fmt]}})
    assert [v.resource for v in violations(run, "secrets-no-key-material")] == ["creds"]


@pytest.mark.parametrize("lead", ["", "#", "# k"])       # every base64 alignment of the key's first line
def test_a_base64_encoded_key_in_binary_data_or_a_plain_env_value_is_a_leak(dev_run, lead):
    encoded = _b64(KEYS["pkcs8"], lead)
    cm = with_resource(dev_run, CONFIG_MAP, "creds", {"apiVersion": "v1", "kind": "ConfigMap",
                                                      "metadata": {"name": "creds", "namespace": "team-a"},
                                                      "binaryData": {"key.pem": encoded}})
    assert findings(cm, "secrets-no-key-material") == [
        "carries a private key in binaryData.key.pem, where it ends up in plan files, state and logs; pass keys "
        "only as an SSH connection's privateKey from a Pulumi secret, or in a Kubernetes Secret's data"]
    env = with_resource(dev_run, JOB, "train", job(containers=[
        {"name": "main", "image": "x", "env": [{"name": "SIGNING_KEY", "value": KEYS["sec1-ec"]}]}]))
    assert [m.split(",")[0] for m in findings(env, "secrets-no-key-material")] == [
        "carries a private key in spec.template.spec.containers[0].env[0].value"]


@pytest.mark.parametrize("width", [76, 64, 3, 2])
def test_a_wrapped_base64_key_is_a_leak_wherever_a_line_ends(dev_run, width):
    """`base64` wraps at 76 columns and PEM tools at 64; narrow widths put a line end inside every "LS0t"."""
    encoded = _b64(KEYS["pkcs8"])
    wrapped = "\n".join(encoded[i:i + width] for i in range(0, len(encoded), width))
    assert "LS0t" not in wrapped or width > 3
    cm = with_resource(dev_run, CONFIG_MAP, "creds", {"apiVersion": "v1", "kind": "ConfigMap",
                                                      "metadata": {"name": "creds", "namespace": "team-a"},
                                                      "data": {"key.b64": wrapped}})
    assert [v.resource for v in violations(cm, "secrets-no-key-material")] == ["creds"]


def test_a_tls_secret_holding_its_key_is_no_leak_since_the_provider_keeps_secret_data_secret(dev_run):
    tls = {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
           "metadata": {"name": "ingress-tls", "namespace": "team-a"},
           "stringData": {"tls.key": KEYS["pkcs8"], "tls.crt": "-----BEGIN CERTIFICATE-----\nMIIB\n"},
           "data": {"ca.key": _b64(KEYS["pkcs1-rsa"])}}
    assert findings(with_resource(dev_run, SECRET, "ingress-tls", tls), "secrets-no-key-material") == []
    # ... but its metadata is no place for one, and a ConfigMap with the same content is a leak
    tls["metadata"]["annotations"] = {"key": KEYS["pkcs8"]}
    assert [m.split(",")[0] for m in findings(with_resource(dev_run, SECRET, "ingress-tls", tls),
                                              "secrets-no-key-material")] == [
        "carries a private key in metadata.annotations.key"]


def test_certificates_public_keys_and_base64_text_are_no_key_material(dev_run):
    harmless = {"crt": "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
                "pub": "-----BEGIN PUBLIC KEY-----\nMIIB\n-----END PUBLIC KEY-----\n",
                "ssh": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl x@y",
                "b64": _b64("just a long configuration text, nothing secret in it at all " * 3),
                "dashes": _b64("----- a banner -----" * 5)}
    run = with_resource(dev_run, CONFIG_MAP, "certs", {"apiVersion": "v1", "kind": "ConfigMap",
                                                       "metadata": {"name": "certs", "namespace": "team-a"},
                                                       "data": harmless})
    assert findings(run, "secrets-no-key-material") == []


def test_an_air_gapped_stack_pulls_every_workload_image_through_its_mirror(prod_run, dev_run):
    images = [{"name": "upstream", "image": "nvcr.io/nvidia/pytorch:25.01-py3"},
              {"name": "hub", "image": "python:3.12"},
              {"name": "mirrored", "image": "registry.prod.example.internal/mirror/nvcr.io/nvidia/pytorch:25.01-py3"},
              {"name": "site", "image": "registry.prod.example.internal/tools/fio:3.33"}]
    run = with_resource(prod_run, JOB, "train", job(containers=images))
    assert findings(run, "k8s-images-from-mirror") == [
        f"Job team-a/train: container {name} pulls {image} from {host}, outside the mirror "
        "registry.prod.example.internal/mirror (kubernetes.image_registry) this air-gapped stack pulls through; "
        "mirror the image and name it as registry.prod.example.internal/..."
        for name, image, host in (("hub", "python:3.12", "docker.io"),
                                  ("upstream", "nvcr.io/nvidia/pytorch:25.01-py3", "nvcr.io"))]
    # a stack without a mirror pulls from wherever its images say
    assert findings(with_resource(dev_run, JOB, "train", job(containers=images)), "k8s-images-from-mirror") == []


@pytest.mark.parametrize("driver,cuda,nccl", [("525.60.13", "12.0", "2.16.2"), ("570.172.08", "12.8.1", "2.26.2"),
                                              ("580.65.06", "13.0", "2.27.7"), ("450.80.02", "11.8", "2.15.5"),
                                              ("535.104.05", "12.2", None), (None, "12.4", "2.21.5")])
def test_a_driver_at_or_above_its_cuda_minimum_with_a_matching_nccl_passes(dev_run, driver, cuda, nccl):
    run = changed(dev_run, "dev-h100", _set(["spec", "pool", "software"], {
        "driver_version": driver, "cuda_version": cuda, "nccl_version": nccl}))
    assert findings(run, "ops-driver-cuda-nccl-compatible") == []


# --- judged by what a resource does, whoever registered it ---------------------------------------------------

def _env(**values):
    return [{"name": k, "value": v} for k, v in values.items()]


MPIJOB = "kubernetes:kubeflow.org/v2beta1:MPIJob"


@pytest.mark.parametrize("type_, inputs, where", [
    (JOB, job(containers=[{"name": "main", "image": "r/t:1", "env": _env(NCCL_IB_TC="0")}]), "train in team-a"),
    ("kubernetes:core/v1:Pod", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team-b"},
                                "spec": {"containers": [{"name": "main", "image": "r/t:1",
                                                         "env": _env(NCCL_IB_TC="0")}]}}, "p in team-b"),
    (MPIJOB, {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "metadata": {"name": "m", "namespace": "team-a"},
              "spec": {"mpiReplicaSpecs": {"Worker": {"replicas": 2, "template": {"spec": {
                  "containers": [{"name": "main", "image": "r/t:1", "env": _env(NCCL_IB_TC="0")}]}}}}}},
     "m in team-a"),
])
def test_a_workload_of_any_kind_that_sets_its_own_nccl_class_is_reported(dev_run, type_, inputs, where):
    found = findings(with_resource(dev_run, type_, "user-workload", inputs), "fabric-nccl-workload-settings")
    assert found == [f"{where} (container main) sets NCCL_IB_TC=0, but the fabric sets NCCL_IB_TC=106 for pool "
                     "h100: remove it and take the pool's NCCL settings (its ConfigMap nccl-<pool>, envFrom)"]


def test_a_workload_that_repeats_the_fabrics_settings_or_sets_its_own_others_is_not_reported(dev_run):
    inputs = job(containers=[{"name": "main", "image": "r/t:1",
                              "env": _env(NCCL_IB_TC="106", NCCL_DEBUG="INFO", MY_VAR="x")}],
                 nodeSelector={"gpucluster.io/pool": "h100"})
    assert findings(with_resource(dev_run, JOB, "train", inputs), "fabric-nccl-workload-settings") == []


def test_a_users_own_command_that_can_wipe_a_storage_server_is_reported_wherever_it_sits(dev_run):
    command = {"connection": {"host": "10.10.0.31", "user": "ops"}, "create": "true",
               "delete": "umount /srv/ost0 && wipefs -a /dev/nvme1n1"}
    found = findings(with_resource(dev_run, "command:remote:Command", "cleanup-ost", command),
                     "storage-servers-protected")
    assert found == ["cleanup-ost connects to storage server stor-dev-01 (10.10.0.31) and its delete runs `wipefs`, "
                     "which destroys data, yet it is not protected: a destroy or a replacement runs it on the server "
                     "that holds the filesystem; protect it or drop that from its delete"]
    assert findings(with_resource(dev_run, "command:remote:Command", "cleanup-ost", command, protect=True),
                    "storage-servers-protected") == []
    harmless = {**command, "delete": "systemctl restart chronyd"}
    assert findings(with_resource(dev_run, "command:remote:Command", "cleanup-ost", harmless),
                    "storage-servers-protected") == []


# --- tenants isolated on the fabric (issue 58) ------------------------------------------------------------------

ISOLATED = ROOT / "examples" / "isolated-tenants.yaml"
IPOIB = "kubernetes:mellanox.com/v1alpha1:IPoIBNetwork"
NAD = "kubernetes:k8s.cni.cncf.io/v1:NetworkAttachmentDefinition"


@pytest.fixture(scope="module")
def isolated_run():
    return run_program(ROOT, "isolated-tenants", spec_file=ISOLATED)


@pytest.mark.parametrize("name", sorted(set(BY_NAME) - {"ssh-host-key-pinned"}))
def test_the_isolated_example_complies(name, isolated_run):
    assert findings(isolated_run, name) == []


def test_a_dedicated_pool_left_in_the_shared_partition_is_a_finding_in_prod_only(tmp_path):
    data = yaml.safe_load(ISOLATED.read_text())
    data["fabric"]["infiniband"]["isolate_dedicated_pools"] = False
    (tmp_path / "flat.yaml").write_text(yaml.safe_dump(data))
    run = run_program(ROOT, "isolated-tenants", spec_file=tmp_path / "flat.yaml")
    assert findings(run, "fabric-dedicated-pool-isolated") == [
        f"node pool {p} is dedicated to tenant {t} in prod but its RDMA ports share the fabric with every other "
        "tenant's hosts; set fabric.infiniband.isolate_dedicated_pools: true" for p, t in
        (("h100-a", "team-a"), ("h100-b", "team-b"))]
    data["environment"] = "staging"
    (tmp_path / "flat.yaml").write_text(yaml.safe_dump(data))
    assert findings(run_program(ROOT, "isolated-tenants", spec_file=tmp_path / "flat.yaml"),
                    "fabric-dedicated-pool-isolated") == []


def test_another_tenants_partition_in_a_network_or_nccl_settings_is_a_finding(isolated_run):
    run = with_resource(isolated_run, IPOIB, "b-on-a", {"metadata": {"name": "b-on-a"}, "spec": {
        "networkNamespace": "team-b", "master": "ibp0s0.8b01", "ipam": "{}"}})
    run = with_resource(run, NAD, "sriov-a", {"metadata": {"name": "sriov-a", "namespace": "team-c"}, "spec": {
        "config": json.dumps({"cniVersion": "0.3.1", "type": "ib-sriov", "pkey": "0x8b01"})}})
    run = with_resource(run, NAD, "own", {"metadata": {"name": "own", "namespace": "team-a"}, "spec": {
        "config": json.dumps({"type": "ib-sriov", "pkey": "0x0b01"})}})                  # its own: fine
    run = with_resource(run, "kubernetes:core/v1:ConfigMap", "nccl-h100-a", {
        "metadata": {"name": "nccl-h100-a", "namespace": "team-b"}, "data": {"NCCL_IB_PKEY": "0"}})
    assert sorted(findings(run, "fabric-no-foreign-partition")) == [
        "ConfigMap team-b/nccl-h100-a gives tenant team-b the NCCL settings of pool h100-a, whose P_Key index 0 is "
        "tenant team-a's partition; remove it",
        "IPoIBNetwork b-on-a puts namespace team-b's pods in tenant team-a's partition 0x0b01; create it in "
        "team-a's namespace only",
        "NetworkAttachmentDefinition sriov-a puts namespace team-c's pods in tenant team-a's partition 0x0b01; "
        "create it in team-a's namespace only"]


@pytest.fixture(scope="module")
def roce_isolated_run(tmp_path_factory):
    from tests.components.fabric.isolated_specs import roce_isolated_data
    path = tmp_path_factory.mktemp("roce") / "roce.yaml"
    path.write_text(yaml.safe_dump(roce_isolated_data()))
    return run_program(ROOT, "roce-isolated", spec_file=path)


def test_the_roce_isolated_spec_passes_the_fabric_isolation_policies(roce_isolated_run):
    for name in ("fabric-dedicated-pool-isolated", "fabric-no-foreign-partition", "fabric-qos-consistent",
                 "fabric-pfc-single-priority"):
        assert findings(roce_isolated_run, name) == [], name


def test_a_dedicated_pool_left_in_the_shared_vlan_is_a_finding_in_prod(tmp_path):
    from tests.components.fabric.isolated_specs import roce_isolated_data
    data = roce_isolated_data(change=lambda d: d["fabric"]["roce"].update(isolate_dedicated_pools=False))
    (tmp_path / "flat.yaml").write_text(yaml.safe_dump(data))
    assert findings(run_program(ROOT, "roce-isolated", spec_file=tmp_path / "flat.yaml"),
                    "fabric-dedicated-pool-isolated") == [
        f"node pool {p} is dedicated to tenant {t} in prod but its RDMA ports share the fabric with every other "
        "tenant's hosts; set fabric.roce.isolate_dedicated_pools: true" for p, t in
        (("h100-a", "team-a"), ("h100-b", "team-b"))]


def test_another_tenants_vlan_in_a_network_or_nccl_settings_is_a_finding(roce_isolated_run):
    from tests.components.fabric.isolated_specs import roce_isolated
    vlan = roce_isolated().tenant_vlans["team-a"]
    run = with_resource(roce_isolated_run, "kubernetes:sriovnetwork.openshift.io/v1:SriovNetwork", "b-on-a", {
        "metadata": {"name": "b-on-a", "namespace": "nvidia-network-operator"},
        "spec": {"networkNamespace": "team-b", "resourceName": "rail0", "vlan": vlan}})
    run = with_resource(run, NAD, "sriov-a", {"metadata": {"name": "sriov-a", "namespace": "team-c"}, "spec": {
        "config": json.dumps({"cniVersion": "0.3.1", "type": "sriov", "vlan": vlan})}})
    run = with_resource(run, "kubernetes:mellanox.com/v1alpha1:MacvlanNetwork", "tagged", {
        "metadata": {"name": "tagged"}, "spec": {"networkNamespace": "team-b", "master": f"ens1np0.{vlan}"}})
    run = with_resource(run, NAD, "own", {"metadata": {"name": "own", "namespace": "team-a"}, "spec": {
        "config": json.dumps({"type": "sriov", "vlan": vlan})}})                           # its own: fine
    run = with_resource(run, "kubernetes:core/v1:ConfigMap", "nccl-h100-a", {
        "metadata": {"name": "nccl-h100-a", "namespace": "team-b"}, "data": {"NCCL_IB_GID_INDEX": "3"}})
    assert sorted(findings(run, "fabric-no-foreign-partition")) == [
        "ConfigMap team-b/nccl-h100-a gives tenant team-b the NCCL settings of pool h100-a, whose ports are in "
        "tenant team-a's VLAN; remove it",
        f"MacvlanNetwork tagged puts namespace team-b's pods in tenant team-a's VLAN {vlan}; create it in team-a's "
        "namespace only",
        f"NetworkAttachmentDefinition sriov-a puts namespace team-c's pods in tenant team-a's VLAN {vlan}; create it "
        "in team-a's namespace only",
        f"SriovNetwork b-on-a puts namespace team-b's pods in tenant team-a's VLAN {vlan}; create it in team-a's "
        "namespace only"]
