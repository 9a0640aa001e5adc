"""Kubernetes workloads and releases: GPU limits, Kueue queues, no host access, pinned charts, known versions."""

from __future__ import annotations

import re

import yaml
from pulumi_policy import (EnforcementLevel, ReportViolation, ResourceValidationArgs, ResourceValidationPolicy,
                           StackValidationArgs, StackValidationPolicy)

from .common import (FABRIC, GPU, HELM_RELEASE, K8S_STACK, KUEUE, QUEUE_LABEL, containers, dig, guarded, intent, is_kind,
                     kind_of, mapping, maps, name_of, namespace_of, of_type, pod_specs, queue_label, schema, settings,
                     shown, strings, system_namespaces, tenant_namespaces, text, workload)

# Pod Security restricted: containers drop ALL and may add only NET_BIND_SERVICE (kubernetes.io/docs/concepts/
# security/pod-security-standards, "Capabilities (v1.22+)").
RESTRICTED_CAPABILITIES = frozenset({"NET_BIND_SERVICE"})
_EXACT_VERSION = re.compile(r"v?\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?")


def _gpu_limit_problems(what: str, pod_spec) -> list[str]:
    out = []
    for c in containers(pod_spec):
        requests, limits = mapping(dig(c, "resources", "requests")), mapping(dig(c, "resources", "limits"))
        if GPU in requests and GPU not in limits:
            out.append(f"{what}: container {c.get('name')} requests {GPU} without a limit; GPUs are allocated by "
                       f"limit: set resources.limits['{GPU}']")
        elif GPU in requests and shown(requests[GPU]) != shown(limits[GPU]):
            out.append(f"{what}: container {c.get('name')} requests {shown(requests[GPU])} {GPU} but limits "
                       f"{shown(limits[GPU])}; extended resources cannot be overcommitted: make them equal")
    return out


def _gpu_limits(args: ResourceValidationArgs, report: ReportViolation) -> None:
    for kind, pod_spec in pod_specs(args.resource_type, args.props):
        for message in _gpu_limit_problems(f"{kind} {name_of(args.props)}", pod_spec):
            report(message)


def _job_templates_gpu_limits(args: StackValidationArgs, report: ReportViolation) -> None:
    """Job templates the components hand to users (the fabric's after-apply NCCL jobs) are held to the same rule."""
    for fabric in of_type(args.resources, FABRIC):
        for file, body in sorted(mapping(fabric.props.get("checks")).items()):
            if not file.endswith(".yaml") or not isinstance(body, str):
                continue
            try:
                docs = list(yaml.safe_load_all(body))
            except yaml.YAMLError as e:
                report(f"job template {file} is not YAML ({str(e).splitlines()[0]}); nothing in it was checked",
                       fabric.urn)
                continue
            for doc in docs:
                if not isinstance(doc, dict):
                    continue
                api, kind = str(doc.get("apiVersion", "")), doc.get("kind")
                for k, pod_spec in pod_specs(f"kubernetes:{api if '/' in api else 'core/' + api}:{kind}", doc):
                    for message in _gpu_limit_problems(f"job template {file} ({k} {name_of(doc)})", pod_spec):
                        report(message, fabric.urn)


def _tenant_queue_name(args: StackValidationArgs, report: ReportViolation) -> None:
    tenants = tenant_namespaces(args.resources)
    queues = {(namespace_of(r.props), name_of(r.props)) for r in args.resources
              if is_kind(r.resource_type, KUEUE, "LocalQueue")}
    for r in args.resources:
        ns, found = namespace_of(r.props), workload(r.resource_type)
        if ns not in tenants or found is None:
            continue
        queue, what = queue_label(r.resource_type, r.props), f"{found[0]} {ns}/{name_of(r.props)}"
        where = "its jobs' template" if kind_of(r.resource_type) == ("batch", "CronJob") else "it"
        if queue is None:
            report(f"{what} has no {QUEUE_LABEL} label, so Kueue neither admits nor counts it against the "
                   f"tenant's quota; label {where} with the tenant's LocalQueue", r.urn)
        elif (ns, queue) not in queues:
            report(f"{what} names LocalQueue {queue!r}, which this stack does not create in {ns}; use the "
                   "tenant's LocalQueue", r.urn)


_HOST_ACCESS_SCHEMA = schema(allowedNamespaces={
    "type": "array", "items": {"type": "string"}, "default": [],
    "description": "Namespaces allowed host access besides the platform's system namespaces."})


def _host_access(args: StackValidationArgs, report: ReportViolation) -> None:
    allowed = system_namespaces(args.resources) | set(settings(args, _HOST_ACCESS_SCHEMA)["allowedNamespaces"])
    for r in args.resources:
        for kind, pod_spec in pod_specs(r.resource_type, r.props):
            ns = namespace_of(r.props) or "default"
            if ns in allowed:
                continue
            what = f"{kind} {ns}/{name_of(r.props)}"
            found = [f"{flag}: true" for flag in ("hostNetwork", "hostPID", "hostIPC") if pod_spec.get(flag) is True]
            found += [f"hostPath volume {v.get('name')}" for v in maps(pod_spec.get("volumes")) if v.get("hostPath")]
            for c in containers(pod_spec):
                context = mapping(c.get("securityContext"))
                if context.get("privileged") is True:
                    found.append(f"privileged container {c.get('name')}")
                added = [a for a in strings(dig(context, "capabilities", "add"))
                         if a.upper().removeprefix("CAP_") not in RESTRICTED_CAPABILITIES]
                if added:
                    found.append(f"container {c.get('name')} adding capabilities {', '.join(added)}")
            if found:
                report(f"{what} has {', '.join(found)} outside the system namespaces; only the platform's agents "
                       "get host access (mount storage through a PersistentVolumeClaim; Pod Security restricted "
                       "lets a container add NET_BIND_SERVICE alone)", r.urn)


def _chart_pinned(args: ResourceValidationArgs, report: ReportViolation) -> None:
    if args.resource_type != HELM_RELEASE:
        return
    chart, version = text(args.props.get("chart")) or "", args.props.get("version")
    if chart.startswith(("/", "./", "../")):
        return                 # a chart directory in the repository is pinned by its content
    if not version:
        report(f"Helm release {args.props.get('name') or args.name} (chart {chart}) pins no chart version, so each "
               "update may install a newer chart; set version to an exact release")
    elif not _EXACT_VERSION.fullmatch(str(version)):
        report(f"Helm release {args.props.get('name') or args.name} (chart {chart}) asks for version {version!r}, "
               "not an exact release; pin one such as 1.2.3")


def _known_good_versions(args: StackValidationArgs, report: ReportViolation) -> None:
    for r in of_type(args.resources, K8S_STACK):
        if r.props.get("known_good_versions") is False:
            k = intent(r)
            versions = ", ".join(f"{part} {dig(k, part, 'chart_version')}"
                                 for part in ("gpu_operator", "network_operator", "kueue", "nfd"))
            report(f"{r.name} installs {versions}, which are not a known-good combination (allowed by "
                   "kubernetes.allow_unknown_versions); use a known-good combination", r.urn)


KUBERNETES_POLICIES = [
    ResourceValidationPolicy(
        name="k8s-gpu-limits",
        description="Checks that workloads asking for GPUs set nvidia.com/gpu limits.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=guarded(_gpu_limits)),
    StackValidationPolicy(
        name="k8s-job-templates-gpu-limits",
        description="Checks that the job templates components hand out set nvidia.com/gpu limits.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=guarded(_job_templates_gpu_limits)),
    StackValidationPolicy(
        name="k8s-tenant-queue-name",
        description="Checks that workloads in tenant namespaces name one of the tenant's Kueue LocalQueues.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=guarded(_tenant_queue_name)),
    StackValidationPolicy(
        name="k8s-no-host-access",
        description="Checks that nothing outside the system namespaces is privileged, adds capabilities beyond "
                    "Pod Security restricted or uses the host's network, PID or IPC namespace or a hostPath volume.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=guarded(_host_access),
        config_schema=_HOST_ACCESS_SCHEMA),
    ResourceValidationPolicy(
        name="k8s-helm-chart-pinned",
        description="Checks that every Helm release pins an exact chart version.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=guarded(_chart_pinned)),
    StackValidationPolicy(
        name="k8s-known-good-versions",
        description="Checks that the operators' versions are a known-good combination.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=guarded(_known_good_versions)),
]
