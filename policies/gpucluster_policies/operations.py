"""Power and operations: racks within their derated PDU budget, GPU temperature alert, burn-in, uniform software."""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any, Mapping

from pulumi_policy import EnforcementLevel, ReportViolation, StackValidationArgs, StackValidationPolicy

from .common import (CLUSTER, NODE_POOL, PROMETHEUS_RULE, dig, environment, guarded, intent, is_kind, items,
                     mapping, maps, metadata, name_of, number, of_type, schema, settings, shown, text,
                     whole_environment)

_POWER_SCHEMA = schema(derating={
    "type": "number", "exclusiveMinimum": 0, "maximum": 1, "default": 0.8,
    "description": "Share of a rack's PDU capacity its hosts may draw at peak (electrical codes size continuous "
                   "loads at 80%)."})


def _rack_power(args: StackValidationArgs, report: ReportViolation) -> None:
    """From the cluster's own rack figures (derived once from the spec): a rack over its budget is a violation,
    and so is one whose figure is a floor (a device without a power figure) or whose PDUs' redundancy is not
    stated, since neither can be called within budget."""
    derating = settings(args, _POWER_SCHEMA)["derating"]
    for cluster in of_type(args.resources, CLUSTER):
        for rack, r in sorted(mapping(cluster.props.get("racks")).items()):
            r = mapping(r)
            capacity = number(r.get("pdu_capacity_kw")) or 0
            budget = capacity * derating
            total = number(r.get("peak_kw")) or 0
            unknown = r.get("unknown")
            if total > budget + 1e-9:
                report(f"rack {rack} draws up to {shown(r.get('peak'))} = {shown(total)} kW at peak (GPUs at TDP plus "
                       f"base power, storage servers, switches), over its budget of {shown(capacity)} kW x "
                       f"{derating:.0%} = {shown(budget)} kW; move hosts to another rack or add PDU capacity",
                       cluster.urn)
            elif unknown:
                names = [shown(u) for u in items(unknown)] or ["a device"]
                report(f"rack {rack}'s power cannot be checked: no power figure for {', '.join(names)} "
                       "(host_base_power_w or host_model, power_w); its known load is "
                       f"{shown(total)} kW of a {shown(budget)} kW budget", cluster.urn)
            elif "pdu_redundancy" in r and not r.get("pdu_redundancy"):
                report(f"rack {rack}'s pdu_redundancy is not stated: is its {shown(capacity)} kW one feed of an A+B "
                       "pair or all its PDUs? Set pdu_redundancy (a+b or none)", cluster.urn)


_TEMP = re.compile(r"DCGM_FI_DEV_GPU_TEMP\b[^<>]*>=?\s*([0-9]+(?:\.[0-9]+)?)")
_TEMP_SCHEMA = schema(
    maxCelsius={"type": "number", "default": 85, "description": "Highest GPU temperature the alert may fire at."},
    minCelsius={"type": "number", "default": 75,
                "description": "Lowest, in minEnvironments: below it the alert fires on every busy GPU (an H800 "
                               "runs up to its Max Operating Temp, 87 C, within NVIDIA's limits)."},
    minEnvironments={"type": "array", "items": {"type": "string"}, "default": ["prod"],
                     "description": "Environments whose alert must not fire below minCelsius."})


@whole_environment
def _temperature_alert(args: StackValidationArgs, report: ReportViolation) -> None:
    config = settings(args, _TEMP_SCHEMA)
    limit = config["maxCelsius"]
    alerts = []
    for rule_set in of_type(args.resources, PROMETHEUS_RULE):
        for group in maps(dig(rule_set.props, "spec", "groups")):
            for rule in maps(group.get("rules")):
                m = _TEMP.search(str(rule.get("expr") or ""))
                if rule.get("alert") and m:
                    alerts.append((rule_set, rule.get("alert"), float(m.group(1))))
    if not alerts:
        report(f"no alert watches GPU temperature (DCGM_FI_DEV_GPU_TEMP); enable kubernetes.monitoring so one "
               f"fires above at most {limit:g} C")
    low = config["minCelsius"] if environment(args.resources) in config["minEnvironments"] else None
    for rule_set, name, threshold in alerts:
        if threshold > limit:
            report(f"alert {name} fires above {threshold:g} C, later than {limit:g} C, when GPUs already throttle; "
                   f"set kubernetes.monitoring.gpu_temperature_limit_c to at most {limit:g}", rule_set.urn)
        elif low is not None and threshold < low:
            report(f"alert {name} fires above {threshold:g} C, below the {low:g} C a busy GPU reaches within "
                   f"NVIDIA's limits, so it fires on every busy node in {environment(args.resources)}; set "
                   f"kubernetes.monitoring.gpu_temperature_limit_c to {low:g}-{limit:g}", rule_set.urn)


_BURN_IN_SCHEMA = schema(requiredEnvironments={
    "type": "array", "items": {"type": "string"}, "default": ["prod"],
    "description": "Environments whose node pools must burn in new nodes."})


def _burn_in(args: StackValidationArgs, report: ReportViolation) -> None:
    env = environment(args.resources)
    if env not in settings(args, _BURN_IN_SCHEMA)["requiredEnvironments"]:
        return
    for pool in of_type(args.resources, NODE_POOL):
        spec = mapping(intent(pool).get("pool"))
        if mapping(spec.get("burn_in")).get("enabled", True) is False:
            report(f"node pool {spec.get('name')} skips burn-in in {env}, so a node with a bad GPU, NIC or cable "
                   "takes production work; set burn_in.enabled: true", pool.urn)


_ROLLOUT_SCHEMA = schema(requiredEnvironments={
    "type": "array", "items": {"type": "string"}, "default": ["prod"],
    "description": "Environments where a rollout must leave part of each pool in service."})


def _rollout_bounded(args: StackValidationArgs, report: ReportViolation) -> None:
    """A rollout batch of the whole pool (max_unavailable 100%, or a count of every host) stops every job on it
    at once: what the rollout exists to avoid."""
    env = environment(args.resources)
    if env not in settings(args, _ROLLOUT_SCHEMA)["requiredEnvironments"]:
        return
    for pool in of_type(args.resources, NODE_POOL):
        spec = mapping(intent(pool).get("pool"))
        hosts, m = len(items(spec.get("hosts"))), mapping(spec.get("rollout")).get("max_unavailable", "10%")
        percent = re.fullmatch(r"([0-9]+)%", str(m))
        batch = -(-hosts * int(percent[1]) // 100) if percent else number(m)   # a count arrives as a float
        if hosts > 1 and batch is not None and batch >= hosts:
            report(f"node pool {spec.get('name')} rolls all {hosts} hosts in one batch (rollout.max_unavailable "
                   f"{shown(m)}) in {env}: a disruptive change stops every job on the pool at once; set a share such as "
                   "'25%'", pool.urn)


_QUARANTINE_SCHEMA = schema(requiredEnvironments={
    "type": "array", "items": {"type": "string"}, "default": ["prod"],
    "description": "Environments where a GPU fault must take its node out of service."})
# node-readiness-controller's rule, over node-problem-detector's GPU fault condition (components/k8s/health/detector.py).
_READINESS = "readiness.node.x-k8s.io"
_FAULT_CONDITION = "GpuHardwareFault"


def _rule_name(props: Mapping[str, Any]) -> str | None:
    """The rule as the spec knows it: its name without the digest of its spec (quarantine.RULE_LABEL)."""
    return text(mapping(metadata(props).get("labels")).get("gpucluster.io/readiness-rule")) or name_of(props)


def _quarantine(args: StackValidationArgs, report: ReportViolation) -> None:
    """A GPU that faults after burn-in (an XID 79, a double-bit ECC error) must stop taking jobs: some
    NodeReadinessRule on the fault condition taints nodes, not only previews it (dry run)."""
    env = environment(args.resources)
    if env not in settings(args, _QUARANTINE_SCHEMA)["requiredEnvironments"]:
        return
    rules = [r for r in args.resources if is_kind(r.resource_type, _READINESS, "NodeReadinessRule")
             and _FAULT_CONDITION in [c.get("type") for c in maps(dig(r.props, "spec", "conditions"))]]
    if any(mapping(r.props.get("spec")).get("dryRun") is not True for r in rules):
        return
    names = ", ".join(sorted(str(_rule_name(r.props)) for r in rules))
    why = (f"its GPU quarantine rule{'s' if len(rules) > 1 else ''} {names} only preview{'' if len(rules) > 1 else 's'}"
           " (dry run)" if rules else f"no NodeReadinessRule acts on {_FAULT_CONDITION}")
    report(f"{why} in {env}, so a node whose GPU faults after burn-in keeps taking jobs; set "
           "kubernetes.health.quarantine.mode: enforce (with kubernetes.health.enabled)")


_SOFTWARE = (("driver_version", "driver"), ("cuda_version", "CUDA"), ("nccl_version", "NCCL"))


def _skew(args: StackValidationArgs, report: ReportViolation, training_only: bool) -> None:
    """Pools whose jobs can meet (training pools: Kueue may admit a job's pod sets on several, and NCCL runs
    across them) must match; an inference pool never shares a job with a training pool, so a skew there is
    only advice."""
    pools = [mapping(intent(p).get("pool")) for p in of_type(args.resources, NODE_POOL)]
    pools = [p for p in pools if not mapping(p.get("software")).get("allow_version_skew")
             and (not training_only or p.get("workload", "training") == "training")]
    for key, label in _SOFTWARE:
        versions: dict[str, list[str]] = defaultdict(list)
        for p in pools:
            version = text(mapping(p.get("software")).get(key))
            if version:
                versions[version].append(str(p.get("name")))
        if len(versions) > 1:
            found = "; ".join(f"{v} on {', '.join(sorted(names))}" for v, names in sorted(versions.items()))
            if training_only:
                report(f"training pools run different {label} versions ({found}); jobs spanning pools fail or slow "
                       f"down on mismatched {label}: use one version, or set software.allow_version_skew on a "
                       "canary pool")
            else:
                report(f"node pools run different {label} versions ({found}); pools that never share a job may, "
                       "but one version is one set of known issues: align them when you can")


# The oldest driver each CUDA major runs on (CUDA minor version compatibility: an image built with any 12.x
# toolkit runs on a 12.x-capable driver), from NVIDIA's CUDA Compatibility guide, "Minor Version Compatibility",
# Table 1, and the CUDA Toolkit release notes' driver table (11.x: 450.80.02; 12.x: 525.60.13, the 12.0 GA
# driver; 13.x: 580.65.06, the 13.0 GA driver). Below it CUDA does not initialize ("CUDA driver version is
# insufficient for CUDA runtime version").
CUDA_MIN_DRIVER = {11: (450, 80, 2), 12: (525, 60, 13), 13: (580, 65, 6)}
# The first NCCL release built for each CUDA major (NCCL's release notes list the CUDA versions each release
# supports; NVIDIA's nvidia-nccl-cu12 wheels start at 2.16.2 and the CUDA 13 builds at 2.27.7).
CUDA_MIN_NCCL = {12: (2, 16, 2), 13: (2, 27, 7)}


def _numbers(version: str) -> tuple[int, ...]:
    """The leading dotted numbers of a version (570.124.06 -> (570, 124, 6); 2.26.2-1 -> (2, 26, 2))."""
    m = re.match(r"\d+(?:\.\d+)*", version.strip().lstrip("v"))
    return tuple(int(x) for x in m.group(0).split(".")) if m else ()


def _dotted(numbers: tuple[int, ...]) -> str:
    return ".".join(f"{n:02d}" if i == 2 and len(numbers) == 3 and numbers[0] > 100 else str(n)
                    for i, n in enumerate(numbers))


def _compatible_software(args: StackValidationArgs, report: ReportViolation) -> None:
    """A pool's driver runs the CUDA its images are built for, and their NCCL is a build for that CUDA."""
    for pool in of_type(args.resources, NODE_POOL):
        spec = mapping(intent(pool).get("pool"))
        sw, name = mapping(spec.get("software")), spec.get("name")
        driver, cuda, nccl = (_numbers(text(sw.get(k)) or "") for k in ("driver_version", "cuda_version",
                                                                         "nccl_version"))
        if not cuda:
            continue
        need = CUDA_MIN_DRIVER.get(cuda[0])
        if driver and need and driver < need:
            report(f"node pool {name} runs driver {sw.get('driver_version')} but its images are built for CUDA "
                   f"{sw.get('cuda_version')}, which needs driver {_dotted(need)} or newer (NVIDIA's CUDA "
                   "compatibility table): CUDA would not initialize; upgrade software.driver_version", pool.urn)
        elif driver and cuda[0] > max(CUDA_MIN_DRIVER):
            report(f"node pool {name} states CUDA {sw.get('cuda_version')}, newer than this policy pack knows; "
                   "check the driver against NVIDIA's CUDA compatibility table", pool.urn)
        first = CUDA_MIN_NCCL.get(cuda[0])
        if nccl and first and nccl < first:
            report(f"node pool {name} states NCCL {sw.get('nccl_version')} with CUDA {sw.get('cuda_version')}, but "
                   f"the first NCCL built for CUDA {cuda[0]} is {_dotted(first)}: the images cannot carry that pair; "
                   "correct software.nccl_version or cuda_version", pool.urn)


def _uniform_training_software(args: StackValidationArgs, report: ReportViolation) -> None:
    _skew(args, report, training_only=True)


def _uniform_software(args: StackValidationArgs, report: ReportViolation) -> None:
    _skew(args, report, training_only=False)


OPERATIONS_POLICIES = [
    StackValidationPolicy(
        name="power-rack-budget",
        description="Checks that each rack's peak power stays within its PDU capacity times the derating.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=guarded(_rack_power), config_schema=_POWER_SCHEMA),
    StackValidationPolicy(
        name="ops-gpu-temperature-alert",
        description="Checks that an alert fires when a GPU runs hotter than the stack's limit (85 C by default).",
        enforcement_level=EnforcementLevel.MANDATORY, validate=guarded(_temperature_alert), config_schema=_TEMP_SCHEMA),
    StackValidationPolicy(
        name="ops-burn-in-enabled",
        description="Checks that every node pool of a production environment burns in its nodes.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=guarded(_burn_in), config_schema=_BURN_IN_SCHEMA),
    StackValidationPolicy(
        name="ops-rollout-bounded",
        description="Checks that a production pool's rollout leaves part of the pool in service.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=guarded(_rollout_bounded),
        config_schema=_ROLLOUT_SCHEMA),
    StackValidationPolicy(
        name="ops-gpu-quarantine-enforced",
        description="Checks that a production environment takes a node whose GPU faults out of service.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=guarded(_quarantine),
        config_schema=_QUARANTINE_SCHEMA),
    StackValidationPolicy(
        name="ops-driver-cuda-nccl-compatible",
        description="Checks that each pool's driver runs the CUDA its images are built for and their NCCL is a "
                    "build for that CUDA.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=guarded(_compatible_software)),
    StackValidationPolicy(
        name="ops-uniform-software",
        description="Checks that training pools run the same driver, CUDA and NCCL versions unless a pool opts out.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=guarded(_uniform_training_software)),
    StackValidationPolicy(
        name="ops-uniform-software-all-pools",
        description="Checks that all node pools, inference pools included, run the same driver, CUDA and NCCL "
                    "versions.",
        enforcement_level=EnforcementLevel.ADVISORY, validate=guarded(_uniform_software)),
]
