"""SlurmCluster: Slurm on the pools the spec gives it, through SchedMD's Slinky (slurm-operator and its charts).

The operator writes slurm.conf itself from its Controller and NodeSets (internal/builder/controllerbuilder in
the slurm-operator module): the cluster's name, daemons, auth, cgroup-based process tracking, a `NodeSet=<name>`
line and, with the NodeSet's partition enabled, `PartitionName=<name> Nodes=<name> <config>` per NodeSet, then
the chart's controller extraConf. What this module adds is that extraConf (scheduling, topology, priority, MPI),
the files the operator takes as they are (gres.conf, cgroup.conf, topology.conf: the Controller's
configFileRefs), and one NodeSet per pool. Each NodeSet runs as a DaemonSet on its pool's nodes, so a Slurm
node's name is its host's short name (getDaemonSetPodHostname), which the files below name.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, ClassVar, NamedTuple

import pulumi
import pulumi_kubernetes as k8s
import pulumi_random as random

from ...bash import call, fill, script
from ...fabric.nccl import nccl_envs, pod_env
from ...spec import ClusterSpec, NodePool
from ...spec.cluster import network_operator_enabled
from ...spec.kubernetes import ChartSource
from ...spec.slurm import (DEFAULT_QOS, SLINKY_KNOWN, SLINKY_NAMESPACE, SlurmSettings, directory_groups,
                          directory_password_problem, tenant_directory_groups)
from ...spec.topology import network_places
from ...types import token
from ..helm import Chart, release
from ..images import chart_from, through_mirror
from ..labels import POOL_LABEL, pool_tolerations
from ..rails import pod_networks, rdma_resource
from ..objects import Manifest, register
from ..quantities import binary
from .node_check import PROLOG_EPILOG_TIMEOUT_S, render_scripts

CHARTS = "oci://ghcr.io/slinkyproject/charts"
RELEASE = "slurm"                        # the slurm chart's fullname: Controller "slurm", NodeSets "slurm-worker-*"
OPERATOR_RELEASE = "slurm-operator"
IMAGES = "ghcr.io/slinkyproject"
# The operator chart's images (its values.yaml); their tag is the chart's appVersion.
OPERATOR_REPOSITORIES = {"operator.image": f"{IMAGES}/slurm-operator",
                         "webhook.image": f"{IMAGES}/slurm-operator-webhook"}
SHM_VOLUME = "dshm"
MARIADB = "slurm-mariadb"                # the in-cluster database's StatefulSet and Service
DATABASE_SECRET = "slurm-database"       # its generated password (key `password`)
# The operator's names (controller_keys.go; the chart's _slurm.tpl): slurm.conf in ConfigMap <controller>-config,
# the auth/slurm key in Secret <release>-auth-slurm under slurm.key, both read from /etc/slurm.
OPERATOR_CONFIG, AUTH_SECRET = f"{RELEASE}-config", f"{RELEASE}-auth-slurm"
ACCOUNTS = "slurm-accounts"
USER_SYNC = "slurm-account-members"       # CronJob: the login groups' members into their tenants' accounts
USER_SYNC_SCHEDULE = "*/10 * * * *"
ACCOUNTS_DIR = "/opt/gpucluster"
LOG_TAILER = ("docker.io/library/alpine", "3.22")     # the chart's logfile sidecars (it defaults to latest)
LOGIN_SET = "tenants"                    # the chart's key: LoginSet slurm-login-tenants
LOGIN_BIND = "slurm-login-directory"     # Secret: bind.conf, the bind password (a Pulumi secret)
SSSD_CONF_SECRET = f"{RELEASE}-sssd-conf"   # the chart's Secret of sssd.conf (slurm.sssdConf.name)
SSSD_DOMAIN = "directory"
SSSD_BIND = "/etc/sssd/conf.d/bind.conf"            # sssd merges conf.d/*.conf (root, 0600) into sssd.conf
DIRECTORY_CA = "/etc/gpucluster/directory-ca.crt"
BIND_ANNOTATION = "gpucluster.io/directory-credentials"
LOGIN_SSHD = "PermitRootLogin no"      # after the operator's sshd_config: a login is a tenant member's own


def charts(s: SlurmSettings) -> tuple[Chart, Chart]:
    """The operator's chart (its CRDs as a dependency) and the Slurm cluster's, from one Slinky release."""
    source = ChartSource(chart_repository=s.chart_repository)
    return (chart_from(source, f"{CHARTS}/slurm-operator", s.version, None),
            chart_from(source, f"{CHARTS}/slurm", s.version, None))


def slurm_release(s: SlurmSettings) -> str:
    """The Slurm release the Slinky release runs (an allowed unknown one: the newest known's)."""
    return SLINKY_KNOWN.get(s.version, list(SLINKY_KNOWN.values())[-1])


def slurm_tag(spec: ClusterSpec) -> str:
    """The Slurm images' tag the pinned chart defaults to (helm/slurm/values.yaml): <Slurm release>-ubuntu24.04."""
    return f"{slurm_release(spec.kubernetes.slurm)}-ubuntu24.04"


def log_tailer() -> dict[str, str]:
    return {"repository": LOG_TAILER[0], "tag": LOG_TAILER[1]}


def node_name(hostname: str) -> str:
    """The Slurm node a NodeSet's DaemonSet pod registers as: its Kubernetes node's name up to the first dot."""
    return hostname.split(".", 1)[0]


def slurm_pools(spec: ClusterSpec) -> list[NodePool]:
    pools = spec.pools
    return [pools[name] for name in spec.kubernetes.slurm.pools if name in pools]


def gres_type(pool: NodePool) -> str:
    """The GPU model as a GRES type (`--gres=gpu:h100-sxm5-80gb:8`): lowercase, no ':' or ','."""
    return re.sub(r"[^a-z0-9_.-]", "-", pool.gpu.model.lower())


def render_gres_conf(spec: ClusterSpec) -> str:
    """Per pool, the GPUs' device files and the logical cores (Slurm's numbering: cores, not threads, socket by
    socket) of the NUMA node each GPU sits on, the GPUs spread evenly over the NUMA nodes as the spec says."""
    lines = ["# GPUs of each Slurm pool and the cores of their NUMA node (generated by gpucluster)"]
    for pool in slurm_pools(spec):
        numa = pool.numa_nodes_per_host
        cores = pool.cpu_cores_per_host // pool.threads_per_core // numa
        nodes = ",".join(node_name(h.hostname) for h in pool.hosts)
        by_numa: dict[int, list[int]] = {}
        for gpu in range(pool.gpu.count):
            by_numa.setdefault(gpu * numa // pool.gpu.count, []).append(gpu)
        for node, gpus in sorted(by_numa.items()):
            files = f"/dev/nvidia{gpus[0]}" if len(gpus) == 1 else f"/dev/nvidia[{gpus[0]}-{gpus[-1]}]"
            lines.append(f"NodeName={nodes} Name=gpu Type={gres_type(pool)} File={files} "
                         f"Cores={node * cores}-{(node + 1) * cores - 1}")
    return "\n".join(lines) + "\n"


def render_cgroup_conf() -> str:
    """Jobs confined to the cores, memory and GPUs they were given (cgroup v2, as the operator's own default;
    IgnoreSystemd as it sets, since slurmd runs in a pod without systemd)."""
    return ("CgroupPlugin=cgroup/v2\nIgnoreSystemd=yes\nConstrainCores=yes\nConstrainDevices=yes\n"
            "ConstrainRAMSpace=yes\nConstrainSwapSpace=yes\n")


def render_topology_conf(spec: ClusterSpec) -> str:
    """The switch tree of Kueue's topology levels, from the same cabling plan: hosts under their leaf (their
    first rail's, or their rack without leaves), leaves under their block, blocks under the cluster."""
    blocks, leaves = network_places(spec)
    tree: dict[str, dict[str, list[str]]] = {}
    for pool in slurm_pools(spec):
        for host in pool.hosts:
            leaf = leaves.get(host.hostname, host.rack)
            tree.setdefault(blocks[host.rack], {}).setdefault(leaf, []).append(node_name(host.hostname))
    lines = ["# Switch tree of the Slurm pools' hosts (generated by gpucluster from the cabling plan)"]
    for block in sorted(tree):
        for leaf in sorted(tree[block]):
            lines.append(f"SwitchName={_switch(leaf)} Nodes={','.join(tree[block][leaf])}")
    for block in sorted(tree):
        leaves_of = ",".join(_switch(x) for x in sorted(tree[block]))
        lines.append(f"SwitchName={_switch(block, 'block')} Switches={leaves_of}")
    if len(tree) > 1:
        lines.append(f"SwitchName={_switch(spec.name, 'cluster')} "
                     f"Switches={','.join(_switch(b, 'block') for b in sorted(tree))}")
    return "\n".join(lines) + "\n"


def _switch(name: str, level: str = "") -> str:
    """A switch name unique across levels (a block may be named like a rack)."""
    return f"{level}-{name}" if level else name


def _days(hours: int) -> str:
    return f"{hours // 24}-{hours % 24:02d}:00:00"


def render_extra_conf(spec: ClusterSpec) -> str:
    """What slurm.conf gets beyond the operator's own lines."""
    s = spec.kubernetes.slurm
    return "\n".join([
        "SelectType=select/cons_tres",            # GPUs as trackable resources (GRES) next to cores and memory
        "TopologyPlugin=topology/tree",           # topology.conf: jobs packed under as few switches as fit
        "MpiDefault=pmix",                        # srun starts MPI ranks itself
        "PriorityType=priority/multifactor",
        f"PriorityDecayHalfLife={_days(s.priority_decay_half_life_h)}",
        "PriorityWeightFairshare=100000",         # fair share dominates; age breaks ties between equal shares
        "PriorityWeightAge=1000",
        "PriorityMaxAge=7-00:00:00",
        "PriorityWeightQOS=10000",                # a higher priority class's QOS runs first
        "PreemptType=preempt/qos",                # ... and requeues lower ones' jobs (each QOS's Preempt list)
        "PreemptMode=REQUEUE",
        "AccountingStorageEnforce=associations,limits,qos",   # a job runs under a tenant's account and limits
        # GPUs tracked per model too, which the accounts' per-pool limits count in. The operator writes its own
        # AccountingStorageTRES=gres/gpu above; Slurm uses the latest value (and logs that it was given twice).
        f"AccountingStorageTRES={','.join(gpu_tres(spec))}",
        "JobSubmitPlugins=lua",                   # job_submit.lua: GPUs asked without a model get the pool's
        # The node check (node_check.py) bounds each of its commands; Slurm kills a prolog or epilog only past
        # this, which the check's own bounds stay under. A job whose prolog failed (its node drained) is requeued
        # to run elsewhere, not held for a person to release.
        f"PrologEpilogTimeout={PROLOG_EPILOG_TIMEOUT_S}",
        "SchedulerParameters=nohold_on_prolog_fail",
    ])


_JOB_SUBMIT = """-- Slurm's job_submit plugin (generated by gpucluster): GPUs asked for without a model (--gpus=8,
-- --gres=gpu:8) get the model of the partition's pool, so that the account's limit on that pool's GPUs
-- (GrpTRES=gres/gpu:<model>) counts them: Slurm counts a model's TRES only for jobs that name the model.
local MODELS = {
@MODELS@
}
local DEFAULT_PARTITION = "@DEFAULT@"
local FIELDS = {"tres_per_job", "tres_per_node", "tres_per_socket", "tres_per_task"}

-- The name and count of an entry that asks for GPUs without a model ("gres/gpu:8", "gres:gpu", "gpu:2"); nil
-- for GPUs of a model ("gres/gpu:h100:8") and for other resources.
local function untyped(entry)
  local name, count = string.match(entry, "^(.-gpu)(:?%d*)$")
  if name == "gpu" or name == "gres/gpu" or name == "gres:gpu" then
    return name, count
  end
end

-- The one GPU model of the partitions (a comma-separated list); nil and why where there is not one.
local function model_of(partitions)
  local model
  for partition in string.gmatch(partitions, "[^,]+") do
    local m = MODELS[partition]
    if m == nil then
      return nil, "partition " .. partition .. " is not a GPU pool's"
    end
    if model ~= nil and m ~= model then
      return nil, "partitions " .. partitions .. " hold different GPU models"
    end
    model = m
  end
  return model
end

-- `say`: how a refusal reaches the user (sbatch prints slurm.log_user's; job_modify can only log).
local function give_model(job_desc, partitions, say)
  local model, why
  for _, field in ipairs(FIELDS) do
    local request = job_desc[field]
    if request ~= nil and request ~= "" then
      local out, changed = {}, false
      for entry in string.gmatch(request, "[^,]+") do
        local name, count = untyped(entry)
        if name ~= nil then
          if model == nil then
            model, why = model_of(partitions)
            if model == nil then
              say("gpucluster: %s; ask for GPUs of one model (--gpus=<model>:<count>, " ..
                  "--gres=gpu:<model>:<count>) or submit to one partition", why)
              return slurm.ERROR
            end
          end
          entry = name .. ":" .. model .. count
          changed = true
        end
        table.insert(out, entry)
      end
      if changed then
        job_desc[field] = table.concat(out, ",")
      end
    end
  end
  return slurm.SUCCESS
end

function slurm_job_submit(job_desc, part_list, submit_uid)
  return give_model(job_desc, job_desc.partition or DEFAULT_PARTITION, slurm.log_user)
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  local function say(message, ...)
    slurm.log_info("job %d: " .. message, job_rec.job_id, ...)
  end
  return give_model(job_desc, job_desc.partition or job_rec.partition or DEFAULT_PARTITION, say)
end

return slurm.SUCCESS
"""


def render_job_submit(spec: ClusterSpec) -> str:
    """The job_submit plugin's script (slurm.conf's directory, where slurmctld reads it): each pool's partition
    and its GPU model."""
    models = "\n".join(f'  ["{p.name}"] = "{gres_type(p)}",' for p in slurm_pools(spec))
    return _JOB_SUBMIT.replace("@MODELS@", models).replace("@DEFAULT@", spec.kubernetes.slurm.default or "")


def partition_config(s: SlurmSettings, pool: NodePool) -> dict[str, str]:
    return {"State": "UP", "Default": "YES" if pool.name == s.default else "NO",
            "MaxTime": _days(s.partition_max_time_h) if s.partition_max_time_h else "UNLIMITED"}


def render_nodeset(spec: ClusterSpec, pool: NodePool) -> dict[str, Any]:
    """One slurmd per node of the pool, holding all of its GPUs (and an RDMA device where the fabric has one),
    with the pool's NCCL settings and a memory-backed /dev/shm."""
    limits: dict[str, str] = {pool.gpu_resource_name: str(pool.gpu.count)}
    if network_operator_enabled(spec) and pool.nics:
        limits[rdma_resource(spec)] = "1"
    shm = pool.tuning.shm_size_gib or max(1, pool.memory_gib_per_host // 2)
    env = [{"name": k, "value": v} for k, v in sorted(pod_env(nccl_envs(spec)[pool.name]).items())]
    networks = pod_networks(spec, pool)
    return {
        "enabled": True,
        "scalingMode": "DaemonSet",
        "replicas": len(pool.hosts),
        "logfile": {"image": log_tailer()},
        "slurmd": {"image": {"repository": f"{IMAGES}/slurmd", "tag": slurm_tag(spec)},
                   "env": env, "resources": {"limits": limits},
                   "volumeMounts": [{"name": SHM_VOLUME, "mountPath": "/dev/shm"}]},
        "extraConfMap": {"Gres": f"gpu:{gres_type(pool)}:{pool.gpu.count}", "Features": gres_type(pool)},
        "partition": {"enabled": True, "configMap": partition_config(spec.kubernetes.slurm, pool)},
        # A NodeSet of its own has none of the chart's example NodeSet's defaults: each is stated. Changes reach
        # the pool's slurmd pods a rollout batch at a time (rollout.max_unavailable, counted in hosts), and
        # Slinky's protection keeps a pod whose node runs a job from being evicted until the job ends.
        "updateStrategy": {"type": "RollingUpdate",
                           "rollingUpdate": {"maxUnavailable": pool.rollout.batch_size(len(pool.hosts))}},
        "workloadDisruptionProtection": True,
        "taintKubeNodes": False,
        "ordinalPadding": 0,
        "metadata": {"annotations": networks} if networks else {},
        "podSpec": {"nodeSelector": {POOL_LABEL: pool.name}, "tolerations": pool_tolerations(pool),
                    "volumes": [{"name": SHM_VOLUME,
                                 "emptyDir": {"medium": "Memory", "sizeLimit": binary(shm, "Gi")}}]},
    }


def render_sssd_conf(spec: ClusterSpec) -> str:
    """The login nodes' sssd: users and groups from the directory, passwords checked by a bind as the user over
    TLS (verified), and only the login groups let in. The bind account's password is not here but in bind.conf,
    a snippet sssd merges into this file (a Secret of its own), so this file is reviewed in the plan."""
    d = spec.kubernetes.slurm.login.directory
    groups = directory_groups(spec)
    # The simple access provider lets everyone in when its lists are empty; the spec refuses that case.
    assert groups, "login without login groups"
    lines = ["# sssd of the Slurm login nodes (generated by gpucluster): only the tenants' admin and edit groups "
             "log in",
             "[sssd]", "config_file_version = 2", "services = nss, pam", f"domains = {SSSD_DOMAIN}", "",
             "[nss]", "filter_users = root, slurm", "filter_groups = root, slurm", "",
             "[pam]", "",
             f"[domain/{SSSD_DOMAIN}]", "id_provider = ldap", "auth_provider = ldap", "access_provider = simple",
             f"simple_allow_groups = {', '.join(groups)}",
             f"ldap_uri = {', '.join(d.uris)}", f"ldap_search_base = {d.search_base}",
             *([f"ldap_user_search_base = {d.user_search_base}"] if d.user_search_base else []),
             *([f"ldap_group_search_base = {d.group_search_base}"] if d.group_search_base else []),
             f"ldap_schema = {d.ldap_schema}",
             *(["ldap_id_use_start_tls = true"] if d.uris[0].startswith("ldap://") else []),
             "ldap_tls_reqcert = demand",
             *([f"ldap_tls_cacert = {DIRECTORY_CA}"] if d.ca_configmap else []),
             *([f"ldap_default_bind_dn = {d.bind_dn}"] if d.bind_dn else []),
             "cache_credentials = false",          # a password is checked by the directory at every login
             "enumerate = false",
             "fallback_homedir = /home/%u",
             "default_shell = /bin/bash"]
    return "\n".join(lines) + "\n"


def render_sssd_bind(password: str) -> str:
    """The bind account's password, as a snippet of sssd.conf's domain section."""
    problem = directory_password_problem(password)
    if problem:               # refused where it enters (the program, the provider, the stack's settings)
        raise ValueError(problem)
    return f"[domain/{SSSD_DOMAIN}]\nldap_default_authtok_type = password\nldap_default_authtok = {password}\n"


def credentials_digest(spec: ClusterSpec, password: str) -> str:
    """Changes with the bind password, so that a new one restarts the login pods (sssd reads it at start, and the
    operator rolls them only for changes to sssd.conf); salted and slow, so it does not give the password away."""
    return hashlib.scrypt(password.encode(), salt=f"gpucluster/{spec.name}/directory".encode(), n=2 ** 14, r=8,
                          p=1, dklen=16).hex()


def _off_gpu_pools() -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": POOL_LABEL, "operator": "DoesNotExist"}]}]}}}


def _directory_files(spec: ClusterSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The bind snippet and the directory's CA where the spec has them, mounted as a login pod mounts them: the
    volume mounts and the volumes."""
    d = spec.kubernetes.slurm.login.directory
    mounts, volumes = [], []
    if d.bind_dn:
        mounts.append({"name": "sssd-bind", "mountPath": SSSD_BIND, "subPath": "bind.conf", "readOnly": True})
        volumes.append({"name": "sssd-bind", "secret": {"secretName": LOGIN_BIND, "defaultMode": 0o600,
                                                        "items": [{"key": "bind.conf", "path": "bind.conf"}]}})
    if d.ca_configmap:
        mounts.append({"name": "directory-ca", "mountPath": DIRECTORY_CA, "subPath": "ca.crt", "readOnly": True})
        volumes.append({"name": "directory-ca", "configMap": {"name": d.ca_configmap,
                                                              "items": [{"key": "ca.crt", "path": "ca.crt"}]}})
    return mounts, volumes


def render_loginset(spec: ClusterSpec, credentials: Any = None) -> dict[str, Any]:
    """Login pods off the GPU pools, replaced one at a time with a new one up first, reached on port 22 through
    the LoginSet's Service. `credentials`: the bind password's digest (credentials_digest), where there is one."""
    login = spec.kubernetes.slurm.login
    mounts, volumes = _directory_files(spec)
    return {
        "enabled": True,
        "replicas": login.replicas,
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
        "login": {"image": {"repository": f"{IMAGES}/login", "tag": slurm_tag(spec)},
                  "resources": {"requests": {"cpu": "1", "memory": "2Gi"}},
                  "volumeMounts": mounts},
        "initconf": {"image": log_tailer()},
        "extraSshdConfig": LOGIN_SSHD,
        "metadata": {"annotations": {BIND_ANNOTATION: credentials}} if credentials is not None else {},
        "podSpec": {"affinity": _off_gpu_pools(), "volumes": volumes},
        "service": {"spec": {"type": login.service_type}},
    }


def render_slurm_values(spec: ClusterSpec, credentials: Any = None) -> dict[str, Any]:
    """The slurm chart's values: the chart's example NodeSet, partition and login set are turned off, so only
    the spec's pools are Slurm nodes, and the spec's login set alone is added."""
    tag, a, m = slurm_tag(spec), spec.kubernetes.slurm.accounting, spec.kubernetes.monitoring
    image = lambda name: {"repository": f"{IMAGES}/{name}", "tag": tag}  # noqa: E731
    return {
        "clusterName": spec.name,
        "configFiles": {"gres.conf": render_gres_conf(spec), "cgroup.conf": render_cgroup_conf(),
                        "topology.conf": render_topology_conf(spec), "job_submit.lua": render_job_submit(spec)},
        "controller": {"slurmctld": {"image": image("slurmctld")}, "reconfigure": {"image": image("slurmctld")},
                       "logfile": {"image": log_tailer()},
                       "extraConf": render_extra_conf(spec),
                       # slurmctld's own OpenMetrics (Slurm 25.11: MetricsType=metrics/openmetrics, which the
                       # operator writes), scraped through the ServiceMonitor it makes: drained nodes alert
                       "metrics": {"enabled": m.enabled, "serviceMonitor": {
                           "enabled": m.enabled, "labels": dict(m.rule_labels) if m.enabled else {}}}},
        "restapi": {"slurmrestd": {"image": image("slurmrestd")}},
        "accounting": {"enabled": True, "slurmdbd": {"image": image("slurmdbd")}, "storageConfig": {
            "host": a.database_host or MARIADB, "port": a.database_port, "database": a.database_name,
            "username": a.database_user, "passwordKeyRef": {"name": a.password_secret or DATABASE_SECRET,
                                                            "key": "password"}}},
        "nodesets": {"slinky": {"enabled": False},
                     **{pool.name: render_nodeset(spec, pool) for pool in slurm_pools(spec)}},
        **render_scripts(spec),
        "partitions": {"all": {"enabled": False}},
        "loginsets": {"slinky": {"enabled": False},
                      **({LOGIN_SET: render_loginset(spec, credentials)} if spec.kubernetes.slurm.login else {})},
        # The chart makes its sssd.conf Secret (the LoginSet's sssdConfRef) from this: the file is reviewed with the
        # values, and the operator restarts the login pods when it changes (their template has its hash).
        **({"sssd": {"conf": render_sssd_conf(spec)}} if spec.kubernetes.slurm.login else {}),
        # The chart's NVIDIA job-mapping prolog/epilog (and its hostPath on every GPU node) is wired in whenever
        # this value is a non-empty string, `false` included (SlinkyProject/slurm-operator#210, in 1.1.0); only
        # the empty string turns it off. Slurm's own prolog and epilog are the node check.
        "vendor": {"nvidia": {"dcgm": {"enabled": ""}}},
    }


class Qos(NamedTuple):
    name: str
    priority: int            # rank among the QOS: Slurm's QOS priority is unsigned, Kueue's classes may be negative
    preempts: tuple[str, ...]


def render_qos(spec: ClusterSpec) -> list[Qos]:
    """A QOS per priority class and Slurm's own `normal` (jobs without a class: Kueue's priority 0), ranked by
    value; each preempts every QOS ranked below it."""
    values = {DEFAULT_QOS: 0, **{pc.name: pc.value for pc in spec.kubernetes.kueue.priority_classes}}
    ranks = {v: r for r, v in enumerate(sorted(set(values.values())))}
    return [Qos(name, ranks[v], tuple(sorted(n for n, w in values.items() if w < v)))
            for name, v in sorted(values.items(), key=lambda kv: (kv[1], kv[0]))]


class Account(NamedTuple):
    fairshare: int
    gpu_limits: dict[str, int]     # GRES type -> the most GPUs of that model its jobs hold at once; absent: no limit


def gpu_types(spec: ClusterSpec) -> dict[str, list[str]]:
    """The Slurm pools' GPU models as GRES types, each with its pools."""
    out: dict[str, list[str]] = {}
    for pool in slurm_pools(spec):
        out.setdefault(gres_type(pool), []).append(pool.name)
    return dict(sorted(out.items()))


def gpu_tres(spec: ClusterSpec) -> list[str]:
    """The GPU TRES slurmctld tracks: all GPUs (what the operator tracks) and each Slurm pool's model."""
    return ["gres/gpu", *(f"gres/gpu:{gpu}" for gpu in gpu_types(spec))]


def tenant_accounts(spec: ClusterSpec) -> dict[str, Account]:
    """Per tenant with GPUs on Slurm pools: its fair share (its guaranteed GPUs there) and, per GPU model, its
    limit as its Kueue quotas would have it: guaranteed plus borrowing_limit on the pools of that model, 0 on a
    model it has no quota on (Kueue would give it no flavor there), no limit where a quota may borrow without one.
    Slurm limits by GPU model (GrpTRES=gres/gpu:<model>), so two Slurm pools of one model share one limit, the
    sum of the two."""
    types = gpu_types(spec)
    on_slurm = {p for pools in types.values() for p in pools}
    out = {}
    for t in spec.tenants:
        held = {p: q for p, q in t.gpu_quota.items() if p in on_slurm}
        if not held:
            continue
        limits = {}
        for gpu, pools in types.items():
            quotas = [held[p] for p in pools if p in held]
            if all(q.borrowing_limit is not None for q in quotas):
                limits[gpu] = sum(q.nominal + q.borrowing_limit for q in quotas)    # type: ignore[operator]
        out[t.name] = Account(max(1, sum(q.nominal for q in held.values())), limits)
    return out


def gpu_limits(account: Account) -> str:
    """The account's GrpTRES of GPUs, as sacctmgr prints it (sorted; empty for none)."""
    return ",".join(f"gres/gpu:{gpu}={n}" for gpu, n in sorted(account.gpu_limits.items()))


def render_accounts_file(spec: ClusterSpec) -> str:
    """The account tree as `sacctmgr load` reads it (its flat-file format): loading it again adds what is new
    and changes what differs. The GPU limits are set by the script (`limits`), which also lifts those the spec
    dropped. An account of a tenant removed from the spec stays, with its usage history; it is deleted by hand
    (`sacctmgr delete account`)."""
    qos = ",".join(q.name for q in render_qos(spec))
    lines = [f"Cluster - '{spec.name}'", "Parent - 'root'"]
    for name, account in sorted(tenant_accounts(spec).items()):
        lines.append(f"Account - '{name}':Description='tenant {name}':Organization='gpucluster':"
                     f"Fairshare={account.fairshare}:QOS='{qos}'")
    return "\n".join(lines) + "\n"


_ACCOUNTS_SCRIPT = r"""
# slurmctld registers the cluster and its GPU TRES (gres/gpu and one per model) with slurmdbd when it starts;
# limits in them need both.
tres() {
  local name
  for name in @GPU_TRES@; do
    [[ -n "$(sacctmgr -n -P show tres type=gres name="$name" format=id 2>/dev/null || true)" ]] || return 1
  done
}
for _ in $(seq 1 @TRIES@); do
  tres && break
  sleep 10
done
tres || fail "slurmdbd does not know the GPU TRES (gres/gpu and gres/gpu:<model>): is slurmctld up, registered" \
  "with slurmdbd, and on a slurm.conf whose AccountingStorageTRES names every model?"
sorted() { tr ',' '\n' <<<"$1" | LC_ALL=C sort | paste -sd, -; }
# qos NAME PRIORITY PREEMPT: create it once, then set what it must be (a second run sets the same). An empty
# Preempt= is not "none" to sacctmgr (a QOS left so makes every QOS that preempts it a "preemption loop"):
# names no longer preempted are removed with Preempt-=.
qos() {
  if [[ "$(sacctmgr -n -P show qos "$1" format=name)" != "$1" ]]; then
    sacctmgr -i add qos "$1" >/dev/null
    changed "added QOS $1"
  fi
  sacctmgr -i modify qos where name="$1" set Priority="$2" PreemptMode=requeue >/dev/null
  local now
  now=$(sorted "$(sacctmgr -n -P show qos "$1" format=preempt)")
  [[ "$now" == "$3" ]] && return 0
  if [[ -n "$now" ]]; then sacctmgr -i modify qos where name="$1" set Preempt-="$now" >/dev/null; fi
  if [[ -n "$3" ]]; then sacctmgr -i modify qos where name="$1" set Preempt="$3" >/dev/null; fi
  changed "QOS $1 preempts ${3:-no QOS}"
}
@QOS@
sacctmgr -i load file=@FILE@
# limits ACCOUNT WANT: the account's GPU limits (its GrpTRES in gres/gpu) become WANT, as sorted as sacctmgr
# prints them; one the spec no longer sets is lifted (=-1). Limits of other TRES a site set by hand are kept.
limits() {
  local now entry entries set=()
  now=$(sacctmgr -n -P show assoc where cluster=@CLUSTER@ account="$1" user= format=GrpTRES)
  now=$(sorted "$(tr ',' '\n' <<<"$now" | grep '^gres/gpu[:=]' || true)")
  [[ "$now" == "$2" ]] && return 0
  if [[ -n "$2" ]]; then set+=("$2"); fi
  IFS=, read -ra entries <<<"$now"
  for entry in "${entries[@]}"; do
    [[ ",$2," == *",${entry%%=*}="* ]] || set+=("${entry%%=*}=-1")
  done
  sacctmgr -i modify account where cluster=@CLUSTER@ name="$1" set GrpTRES="$(IFS=,; echo "${set[*]}")" >/dev/null
  changed "GPU limits of account $1: ${now:-none} -> ${2:-none}"
}
@LIMITS@
"""


def render_accounts_script(spec: ClusterSpec, accounts_file: str, tries: int = 180) -> str:
    """QOS first (accounts name them), then the account tree, then each account's GPU limits; waits up to
    `tries` x 10 s for slurmctld."""
    qos = "\n".join(call("qos", q.name, q.priority, ",".join(q.preempts)) for q in render_qos(spec))
    limits = "\n".join(call("limits", name, gpu_limits(a)) for name, a in sorted(tenant_accounts(spec).items()))
    body = _ACCOUNTS_SCRIPT.replace("@QOS@", qos).replace("@LIMITS@", limits).replace(
        "@GPU_TRES@", call(*(tres.removeprefix("gres/") for tres in gpu_tres(spec))))
    return script("Slurm QOS and the tenants' accounts", ACCOUNTS,
                  fill(body, TRIES=tries, FILE=accounts_file, CLUSTER=spec.name))


# What slurmdbd needs of MariaDB (Slurm's accounting guide; Slinky's installation guide sets the same): a buffer
# pool that holds the job tables and lock waits long enough for its purges and upgrades.
MARIADB_ARGS = ["--innodb-buffer-pool-size=4096M", "--innodb-lock-wait-timeout=900", "--innodb-log-file-size=1024M",
                "--max-allowed-packet=256M", "--binlog-format=row", "--innodb-autoinc-lock-mode=2"]


def render_mariadb(s: SlurmSettings) -> list[Manifest]:
    """The in-cluster database: one MariaDB on a volume of its own, reached by slurmdbd alone. Its password is
    the Secret the component makes from a generated Pulumi secret; the image creates the database and user on
    its first start (MARIADB_DATABASE, MARIADB_USER, MARIADB_PASSWORD) and never again."""
    a = s.accounting
    labels = {"app.kubernetes.io/name": MARIADB, "app.kubernetes.io/part-of": "slurm"}
    claim = {"accessModes": ["ReadWriteOnce"],
             "resources": {"requests": {"storage": binary(a.database_size_gib, "Gi")}},
             **({"storageClassName": a.storage_class} if a.storage_class else {})}
    password = {"secretKeyRef": {"name": DATABASE_SECRET, "key": "password"}}
    container = {
        "name": "mariadb", "image": a.mariadb_image, "args": MARIADB_ARGS,
        "env": [{"name": "MARIADB_DATABASE", "value": a.database_name},
                {"name": "MARIADB_USER", "value": a.database_user},
                {"name": "MARIADB_PASSWORD", "valueFrom": password},
                {"name": "MARIADB_RANDOM_ROOT_PASSWORD", "value": "1"}],
        "ports": [{"name": "mysql", "containerPort": 3306}],
        "readinessProbe": {"tcpSocket": {"port": "mysql"}, "periodSeconds": 10},
        "resources": {"requests": {"cpu": "1", "memory": "6Gi"}, "limits": {"memory": "6Gi"}},
        "volumeMounts": [{"name": "data", "mountPath": "/var/lib/mysql"}],
    }
    return [
        Manifest("mariadb-service", {"apiVersion": "v1", "kind": "Service", "metadata": {
            "name": MARIADB, "namespace": s.namespace, "labels": labels}, "spec": {
            "selector": labels, "ports": [{"name": "mysql", "port": a.database_port, "targetPort": "mysql"}]}}),
        Manifest("mariadb", {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {
            "name": MARIADB, "namespace": s.namespace, "labels": labels}, "spec": {
            "serviceName": MARIADB, "replicas": 1, "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}},
            # The data outlives the StatefulSet: deleting it (or the stack) keeps the accounting history.
            "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Retain", "whenScaled": "Retain"},
            "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": claim}]}}),
    ]


_USER_SYNC_SCRIPT = r"""
# sssd as the login pods run it, unless one already serves this container's lookups.
if [[ ! -S /var/lib/sss/pipes/nss ]]; then
  sssd -i --logger=stderr &
  SSSD=$!
  trap 'kill "$SSSD" 2>/dev/null || true; wait "$SSSD" 2>/dev/null || true' EXIT
  for _ in $(seq 1 30); do [[ -S /var/lib/sss/pipes/nss ]] && break; sleep 1; done
fi
# members GROUP: the group's members, one per line. A group the directory does not answer for (unknown, or the
# directory unreachable) stops the run before anything is removed: no answer is not an empty group.
members() {
  local entry="" _
  for _ in $(seq 1 @TRIES@); do
    entry=$(getent group "$1") && break
    sleep 5
  done
  [[ -n "$entry" ]] || fail "the directory does not answer for group $1 (unknown, or unreachable): nothing changed"
  tr ',' '\n' <<<"${entry##*:}" | sed '/^$/d'
}
# account ACCOUNT GROUP...: the account's users become the groups' members. A user who left keeps running jobs:
# slurmdbd refuses to remove an association with jobs, and the next run tries again.
account() {
  local account=$1 user want have
  shift
  want=$(for g in "$@"; do members "$g"; done | LC_ALL=C sort -u)
  have=$(sacctmgr -n -P show assoc where cluster=@CLUSTER@ account="$account" format=user | sed '/^$/d' |
    LC_ALL=C sort -u)
  for user in $(LC_ALL=C comm -23 <(printf '%s\n' "$want") <(printf '%s\n' "$have")); do
    sacctmgr -i add user "$user" account="$account" cluster=@CLUSTER@ >/dev/null
    changed "added $user to account $account"
  done
  for user in $(LC_ALL=C comm -13 <(printf '%s\n' "$want") <(printf '%s\n' "$have")); do
    if sacctmgr -i delete user where name="$user" account="$account" cluster=@CLUSTER@ >/dev/null; then
      changed "removed $user from account $account"
    else
      note "kept $user in account $account: slurmdbd refused to remove it (running jobs?); tried again next run"
    fi
  done
}
@ACCOUNTS@
"""


def render_user_sync_script(spec: ClusterSpec, tries: int = 6) -> str:
    """The login groups' members as the users of their tenants' accounts, looked up through sssd as a login pod
    does; a group asked for up to `tries` x 5 s."""
    body = _USER_SYNC_SCRIPT.replace("@ACCOUNTS@", "\n".join(
        call("account", name, *groups) for name, groups in sorted(tenant_directory_groups(spec).items())))
    return script("Slurm account members from the tenants' directory groups", USER_SYNC,
                  fill(body, TRIES=tries, CLUSTER=spec.name))


def _digest(files: dict[str, str]) -> str:
    """What a ConfigMap of scripts is named by: a change is a new ConfigMap (and its Job a new Job)."""
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:10]


def _etc_slurm() -> dict[str, Any]:
    """/etc/slurm as a client needs it: the operator's slurm.conf and the auth/slurm key."""
    return {"name": "etc-slurm", "projected": {"sources": [
        {"configMap": {"name": OPERATOR_CONFIG, "items": [{"key": "slurm.conf", "path": "slurm.conf"}]}},
        {"secret": {"name": AUTH_SECRET, "items": [{"key": "slurm.key", "path": "slurm.key", "mode": 0o600}]}}]}}


def render_user_sync(spec: ClusterSpec) -> list[Manifest]:
    """A CronJob in the login image (sssd and the Slurm clients) that runs its own sssd on the login pods' files
    and sets each tenant account's users to its groups' members: who may log in may run jobs, and who left the
    group may not. The chart's sssd.conf Secret and the bind snippet are mounted as in a login pod."""
    s = spec.kubernetes.slurm
    files = {"sync.sh": render_user_sync_script(spec)}
    digest = _digest(files)
    directory_mounts, directory_volumes = _directory_files(spec)
    mounts = [{"name": "etc-slurm", "mountPath": "/etc/slurm", "readOnly": True},
              {"name": "sync", "mountPath": ACCOUNTS_DIR, "readOnly": True},
              {"name": "sssd-conf", "mountPath": "/etc/sssd/sssd.conf", "subPath": "sssd.conf", "readOnly": True},
              *directory_mounts]
    volumes = [_etc_slurm(), {"name": "sync", "configMap": {"name": f"{USER_SYNC}-{digest}"}},
               {"name": "sssd-conf", "secret": {"secretName": SSSD_CONF_SECRET, "defaultMode": 0o600,
                                                "items": [{"key": "sssd.conf", "path": "sssd.conf"}]}},
               *directory_volumes]
    pod = {"restartPolicy": "OnFailure", "affinity": _off_gpu_pools(), "containers": [{
        "name": "sync", "image": f"{IMAGES}/login:{slurm_tag(spec)}",
        "command": ["/bin/bash", f"{ACCOUNTS_DIR}/sync.sh"], "volumeMounts": mounts,
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}}}], "volumes": volumes}
    meta = {"namespace": s.namespace, "labels": {"app.kubernetes.io/name": USER_SYNC}}
    return [Manifest("account-members", {"apiVersion": "v1", "kind": "ConfigMap",
                                         "metadata": {"name": f"{USER_SYNC}-{digest}", **meta}, "data": files}),
            Manifest("account-members-cronjob", {
                "apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": USER_SYNC, **meta},
                "spec": {"schedule": USER_SYNC_SCHEDULE, "concurrencyPolicy": "Forbid",
                         "successfulJobsHistoryLimit": 1, "failedJobsHistoryLimit": 3,
                         "jobTemplate": {"spec": {"backoffLimit": 2, "template": {"spec": pod}}}}})]


def render_accounts_job(spec: ClusterSpec) -> list[Manifest]:
    """The QOS and accounts applied by sacctmgr in a Job, as a login node would: the slurmctld image (it has
    sacctmgr), the operator's slurm.conf and auth/slurm key in /etc/slurm. The Job's name carries a digest of
    what it applies, so a change is a new Job and an unchanged spec none."""
    s = spec.kubernetes.slurm
    files = {"accounts.cfg": render_accounts_file(spec)}
    files["accounts.sh"] = render_accounts_script(spec, f"{ACCOUNTS_DIR}/accounts.cfg")
    digest = _digest(files)
    etc = _etc_slurm()
    pod = {"restartPolicy": "OnFailure", "containers": [{
        "name": "sacctmgr", "image": f"{IMAGES}/slurmctld:{slurm_tag(spec)}",
        "command": ["/bin/bash", f"{ACCOUNTS_DIR}/accounts.sh"],
        "volumeMounts": [{"name": "etc-slurm", "mountPath": "/etc/slurm", "readOnly": True},
                         {"name": "accounts", "mountPath": ACCOUNTS_DIR, "readOnly": True}]}],
        "volumes": [etc, {"name": "accounts", "configMap": {"name": f"{ACCOUNTS}-{digest}"}}]}
    meta = {"namespace": s.namespace, "labels": {"app.kubernetes.io/name": ACCOUNTS}}
    return [Manifest("accounts", {"apiVersion": "v1", "kind": "ConfigMap",
                                  "metadata": {"name": f"{ACCOUNTS}-{digest}", **meta}, "data": files}),
            Manifest("accounts-job", {"apiVersion": "batch/v1", "kind": "Job",
                                      "metadata": {"name": f"{ACCOUNTS}-{digest}", **meta},
                                      "spec": {"backoffLimit": 3, "template": {"spec": pod}}})]


def render_operator_values(spec: ClusterSpec) -> dict[str, Any]:
    """The operator with its CRDs (the chart's slurm-operator-crds dependency, so an upgrade updates them) and
    its webhook's certificate made by Helm, as the stack installs no cert-manager."""
    values: dict[str, Any] = {"crds": {"enabled": True}, "certManager": {"enabled": False}}
    for path, repository in OPERATOR_REPOSITORIES.items():
        part, _, key = path.partition(".")
        values.setdefault(part, {})[key] = {"repository": repository}
    return values


def render_namespaces(spec: ClusterSpec) -> list[Manifest]:
    """The operator's namespace and the cluster's; slurmd runs privileged (it makes the jobs' cgroups)."""
    out = []
    for ns, level in ((SLINKY_NAMESPACE, "restricted"), (spec.kubernetes.slurm.namespace, "privileged")):
        out.append(Manifest(f"ns-{ns}", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": {
            "app.kubernetes.io/managed-by": "pulumi", "gpucluster.io/cluster": spec.name,
            "pod-security.kubernetes.io/enforce": level, "pod-security.kubernetes.io/warn": level,
            "pod-security.kubernetes.io/audit": level}}}))
    return out


class SlurmCluster(pulumi.ComponentResource):
    """Slurm on the spec's Slurm pools: the Slinky operator, then a Slurm cluster of one partition per pool."""

    TYPE: ClassVar[str] = token("SlurmCluster")

    partitions: dict[str, str]
    """Slurm partition per pool (pool name -> partition)."""
    default_partition: str
    """Where jobs go without --partition."""

    def __init__(self, name: str, spec: ClusterSpec, opts: pulumi.ResourceOptions | None = None, *,
                 directory_password: pulumi.Input[str] | None = None):
        """`directory_password`: the password of the login set's directory bind_dn; a secret."""
        super().__init__(self.TYPE, name, intent(spec), opts)
        compose(self, name, spec, directory_password)


def intent(spec: ClusterSpec) -> dict[str, Any]:
    """A SlurmCluster's registered inputs: the spec's slurm section, for policies."""
    return {"spec": spec.kubernetes.slurm.model_dump(mode="json")}


def compose(cluster: Any, name: str, spec: ClusterSpec, directory_password: pulumi.Input[str] | None = None) -> None:
    s = spec.kubernetes.slurm
    if s.secret_settings and directory_password is None:
        raise ValueError(f"kubernetes.slurm.login.directory.bind_dn is {s.login.directory.bind_dn}, whose password "
                         "the login nodes' sssd binds with: give it (the program's secret slurmDirectoryPassword: "
                         "`pulumi config set --secret slurmDirectoryPassword`), or remove bind_dn for anonymous "
                         "lookups")

    def put(m: Manifest, opts: pulumi.ResourceOptions) -> pulumi.Resource:
        return register(f"{name}-{m.role}", through_mirror(m.obj, spec), opts)

    ns = {m.obj["metadata"]["name"]: put(m, pulumi.ResourceOptions(parent=cluster)) for m in render_namespaces(spec)}
    inputs: list[pulumi.Resource] = []           # what the Slurm cluster's pods read at start
    if not s.accounting.database_host:
        password = random.RandomPassword(f"{name}-database-password", length=32, special=False,
                                         opts=pulumi.ResourceOptions(parent=cluster))
        secret = k8s.core.v1.Secret(f"{name}-database-secret", metadata={
            "name": DATABASE_SECRET, "namespace": s.namespace}, string_data={"password": password.result},
            opts=pulumi.ResourceOptions(parent=cluster, depends_on=[ns[s.namespace]]))
        inputs = [secret, *(put(m, pulumi.ResourceOptions(parent=cluster, depends_on=[secret]))
                            for m in render_mariadb(s))]
    credentials = None
    if s.secret_settings:
        bind = pulumi.Output.secret(directory_password)
        inputs.append(k8s.core.v1.Secret(f"{name}-login-directory", metadata={
            "name": LOGIN_BIND, "namespace": s.namespace}, type="Opaque",
            string_data={"bind.conf": bind.apply(render_sssd_bind)},
            opts=pulumi.ResourceOptions(parent=cluster, depends_on=[ns[s.namespace]])))
        # Not a secret: a secret anywhere in the values would hide all of them in the plan, and the digest is
        # salted and slow to search.
        credentials = pulumi.Output.unsecret(bind.apply(lambda p: credentials_digest(spec, p)))
    operator_chart, slurm_chart = charts(s)
    operator = release(f"{name}-operator", OPERATOR_RELEASE, operator_chart, SLINKY_NAMESPACE,
                       through_mirror(render_operator_values(spec), spec),
                       pulumi.ResourceOptions(parent=cluster, depends_on=[ns[SLINKY_NAMESPACE]]))
    # The NodeSets and Controller are the operator's custom resources: its CRDs and webhook come first.
    cluster_release = release(f"{name}-cluster", RELEASE, slurm_chart, s.namespace,
                              through_mirror(render_slurm_values(spec, credentials), spec),
                              pulumi.ResourceOptions(parent=cluster,
                                                     depends_on=[ns[s.namespace], operator, *inputs]))
    # slurmctld registers the cluster with slurmdbd once both run; the Job waits for it, and Pulumi for the Job.
    for m in render_accounts_job(spec) + (render_user_sync(spec) if s.login else []):
        put(m, pulumi.ResourceOptions(parent=cluster, depends_on=[cluster_release]))
    cluster.partitions = {p.name: p.name for p in slurm_pools(spec)}
    cluster.default_partition = s.default or ""
    cluster.register_outputs({**intent(spec), "partitions": cluster.partitions,
                              "default_partition": cluster.default_partition, "release": cluster_release.name})
