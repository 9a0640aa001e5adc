"""Kubernetes workloads and releases: GPU limits, Kueue queues, no host access, pinned charts, known versions."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import yaml
from pulumi_policy import (EnforcementLevel, ReportViolation, ResourceValidationArgs, ResourceValidationPolicy,
                           StackValidationArgs, StackValidationPolicy)

from .common import (CLUSTER, FABRIC, GPU, K8S_STACK, KUEUE, QUEUE_LABEL, containers, dig, guarded, intent, is_kind,
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


def _job_templates(args: StackValidationArgs, report: ReportViolation) -> Iterator[tuple[Any, str, str, Any]]:
    """(fabric, file, kind and name, pod spec) of each pod template in the job templates components hand to users
    (the fabric's after-apply NCCL jobs); a template that is not YAML is reported, never skipped silently."""
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
                    yield fabric, file, f"{k} {name_of(doc)}", pod_spec


def _job_templates_gpu_limits(args: StackValidationArgs, report: ReportViolation) -> None:
    """Job templates the components hand to users are held to the same rule as workloads."""
    for fabric, file, what, pod_spec in _job_templates(args, report):
        for message in _gpu_limit_problems(f"job template {file} ({what})", pod_spec):
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
    """A Helm v3 Release or a v4 Chart (rendered by the provider; a v4 Chart without a version takes the newest)."""
    kind = kind_of(args.resource_type)
    if kind not in (("helm.sh", "Release"), ("helm.sh", "Chart")):
        return
    chart, version = text(args.props.get("chart")) or "", args.props.get("version")
    if chart.startswith(("/", "./", "../")):
        return                 # a chart directory in the repository is pinned by its content
    what = f"Helm {kind[1].lower()} {args.props.get('name') or args.name} (chart {chart})"
    if not version:
        report(f"{what} pins no chart version, so each update may install a newer chart; set version to an exact "
               "release")
    elif not _EXACT_VERSION.fullmatch(str(version)):
        report(f"{what} asks for version {version!r}, not an exact release; pin one such as 1.2.3")


def _image_reference(image: str) -> tuple[str, str | None, bool]:
    """(registry host, tag or None, has a digest) of an image reference, as the container runtime reads it:
    the first path element is a registry only if it has a '.' or ':' or is localhost, else Docker Hub."""
    name, digest = image.partition("@")[::2]
    first, _, rest = name.partition("/")
    host = first if rest and ("." in first or ":" in first or first == "localhost") else "docker.io"
    last = name.rsplit("/", 1)[-1]
    return host, (last.partition(":")[2] or None) if ":" in last else None, bool(digest)


def _unpinned(image: str) -> str | None:
    _, tag, digest = _image_reference(image)
    if digest or tag not in (None, "latest"):
        return None
    return f"image {image} is {'untagged (pulled as :latest)' if tag is None else 'tagged :latest'}"


_PIN = ("a tag that moves: nodes pull whatever it names that day, so a rollout or a rescheduled pod runs another "
        "build; pin a version tag or a digest")


def _json(raw: Any) -> Any:
    """A registered JSON text; anything else (another program's value) reads as absent."""
    try:
        return json.loads(raw) if isinstance(raw, str) else None
    except ValueError:
        return None


def _spec_images(value: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """(field path, image) of every image a cluster's spec names (fields named *_image)."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            where = f"{path}.{k}" if path else str(k)
            if str(k).endswith("_image") and isinstance(v, str):
                yield where, v
            else:
                yield from _spec_images(v, where)
    elif isinstance(value, Sequence) and not isinstance(value, str):
        for i, v in enumerate(value):
            yield from _spec_images(v, f"{path}[{i}]")


def _images_pinned(args: StackValidationArgs, report: ReportViolation) -> None:
    for r in args.resources:
        for kind, pod_spec in pod_specs(r.resource_type, r.props):
            for c in containers(pod_spec):
                found = _unpinned(text(c.get("image")) or "")
                if found and c.get("image"):
                    report(f"{kind} {name_of(r.props)}: container {c.get('name')}'s {found}, {_PIN}", r.urn)
    for cluster in of_type(args.resources, CLUSTER):
        for where, image in _spec_images(_json(cluster.props.get("spec_json"))):
            found = _unpinned(image)
            if found:
                report(f"the spec's {where}: {found}, {_PIN}", cluster.urn)


def _mirror(args: StackValidationArgs) -> str | None:
    stacks = of_type(args.resources, K8S_STACK)
    return text(intent(stacks[0]).get("image_registry")) if stacks else None


def _images_from_mirror(args: StackValidationArgs, report: ReportViolation) -> None:
    """Where the spec names a registry mirror (an air-gapped site), every image a workload or job template
    runs comes from it; the library's own images and the spec's check images are pulled through it already."""
    mirror = _mirror(args)
    if not mirror:
        return
    host = mirror.split("/")[0]

    def check(what: str, pod_spec: Any, urn: str) -> None:
        for c in containers(pod_spec):
            image = text(c.get("image"))
            source = _image_reference(image)[0] if image else host
            if source != host:
                report(f"{what}: container {c.get('name')} pulls {image} from {source}, outside "
                       f"the mirror {mirror} (kubernetes.image_registry) this air-gapped stack pulls through; "
                       f"mirror the image and name it as {host}/...", urn)

    for r in args.resources:
        for kind, pod_spec in pod_specs(r.resource_type, r.props):
            check(f"{kind} {namespace_of(r.props) or 'default'}/{name_of(r.props)}", pod_spec, r.urn)
    for fabric, file, what, pod_spec in _job_templates(args, lambda *_: None):
        check(f"job template {file} ({what})", pod_spec, fabric.urn)


def _known_good_versions(args: StackValidationArgs, report: ReportViolation) -> None:
    for r in of_type(args.resources, K8S_STACK):
        if r.props.get("known_good_versions") is False:
            k = intent(r)
            versions = ", ".join(f"{part} {dig(k, part, 'chart_version')}"
                                 for part in ("gpu_operator", "network_operator", "kueue", "nfd"))
            report(f"{r.name} installs {versions}, which are not a known-good combination (allowed by "
                   "kubernetes.allow_unknown_versions); use a known-good combination", r.urn)


KUBERNETES_POLICIES = [
    StackValidationPolicy(
        name="k8s-image-versions-pinned",
        description="Checks that no workload and no check image of the spec runs an untagged or :latest image.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=guarded(_images_pinned)),
    StackValidationPolicy(
        name="k8s-images-from-mirror",
        description="Checks that an air-gapped stack's workloads and job templates pull every image from its "
                    "registry mirror.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=guarded(_images_from_mirror)),
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
        description="Checks that every Helm release (v3 Release, v4 Chart) pins an exact chart version.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=guarded(_chart_pinned)),
    StackValidationPolicy(
        name="k8s-known-good-versions",
        description="Checks that the operators' versions are a known-good combination.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=guarded(_known_good_versions)),
]
