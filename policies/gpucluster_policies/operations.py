"""Power and operations: racks within their derated PDU budget, GPU temperature alert, burn-in, uniform software."""

from __future__ import annotations

import re
from collections import defaultdict

from pulumi_policy import EnforcementLevel, ReportViolation, StackValidationArgs, StackValidationPolicy

from .common import CLUSTER, NODE_POOL, PROMETHEUS_RULE, environment, intent, of_type, schema, settings

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
        for rack, r in sorted((cluster.props.get("racks") or {}).items()):
            capacity = r.get("pdu_capacity_kw") or 0
            budget = capacity * derating
            total = r.get("peak_kw") or 0
            if total > budget + 1e-9:
                report(f"rack {rack} draws up to {r.get('peak')} = {total:g} kW at peak (GPUs at TDP plus base "
                       f"power, storage servers, switches), over its budget of {capacity:g} kW x {derating:.0%} = "
                       f"{budget:g} kW; move hosts to another rack or add PDU capacity", cluster.urn)
            elif r.get("unknown"):
                report(f"rack {rack}'s power cannot be checked: no power figure for {', '.join(r['unknown'])} "
                       "(host_base_power_w or host_model, power_w); its known load is "
                       f"{total:g} kW of a {budget:g} kW budget", cluster.urn)
            elif "pdu_redundancy" in r and not r.get("pdu_redundancy"):
                report(f"rack {rack}'s pdu_redundancy is not stated: is its {capacity:g} kW one feed of an A+B pair "
                       "or all its PDUs? Set pdu_redundancy (a+b or none)", cluster.urn)


_TEMP = re.compile(r"DCGM_FI_DEV_GPU_TEMP\b[^<>]*>=?\s*([0-9.]+)")
_TEMP_SCHEMA = schema(maxCelsius={"type": "number", "default": 85,
                                  "description": "Highest GPU temperature the alert may fire at."})


def _temperature_alert(args: StackValidationArgs, report: ReportViolation) -> None:
    limit = settings(args, _TEMP_SCHEMA)["maxCelsius"]
    alerts = []
    for rule_set in of_type(args.resources, PROMETHEUS_RULE):
        for group in (rule_set.props.get("spec") or {}).get("groups") or []:
            for rule in group.get("rules") or []:
                m = _TEMP.search(str(rule.get("expr") or ""))
                if rule.get("alert") and m:
                    alerts.append((rule_set, rule.get("alert"), float(m.group(1))))
    if not alerts:
        report(f"no alert watches GPU temperature (DCGM_FI_DEV_GPU_TEMP); enable kubernetes.monitoring so one "
               f"fires above at most {limit:g} C")
    for rule_set, name, threshold in alerts:
        if threshold > limit:
            report(f"alert {name} fires above {threshold:g} C, later than {limit:g} C, when GPUs already throttle; "
                   f"set kubernetes.monitoring.gpu_temperature_limit_c to at most {limit:g}", rule_set.urn)


_BURN_IN_SCHEMA = schema(requiredEnvironments={
    "type": "array", "items": {"type": "string"}, "default": ["prod"],
    "description": "Environments whose node pools must burn in new nodes."})


def _burn_in(args: StackValidationArgs, report: ReportViolation) -> None:
    env = environment(args.resources)
    if env not in settings(args, _BURN_IN_SCHEMA)["requiredEnvironments"]:
        return
    for pool in of_type(args.resources, NODE_POOL):
        spec = intent(pool).get("pool") or {}
        if not (spec.get("burn_in") or {}).get("enabled", True):
            report(f"node pool {spec.get('name')} skips burn-in in {env}, so a node with a bad GPU, NIC or cable "
                   "takes production work; set burn_in.enabled: true", pool.urn)


_SOFTWARE = (("driver_version", "driver"), ("cuda_version", "CUDA"), ("nccl_version", "NCCL"))


def _uniform_software(args: StackValidationArgs, report: ReportViolation) -> None:
    versions: dict[str, dict[str, list[str]]] = {key: defaultdict(list) for key, _ in _SOFTWARE}
    for pool in of_type(args.resources, NODE_POOL):
        spec = intent(pool).get("pool") or {}
        software = spec.get("software") or {}
        if software.get("allow_version_skew"):
            continue
        for key, _ in _SOFTWARE:
            if software.get(key):
                versions[key][software[key]].append(spec.get("name"))
    for key, label in _SOFTWARE:
        if len(versions[key]) > 1:
            found = "; ".join(f"{v} on {', '.join(sorted(p))}" for v, p in sorted(versions[key].items()))
            report(f"node pools run different {label} versions ({found}); jobs spanning pools fail or slow down "
                   f"on mismatched {label}: use one version, or set software.allow_version_skew on a canary pool")


OPERATIONS_POLICIES = [
    StackValidationPolicy(
        name="power-rack-budget",
        description="Checks that each rack's peak power stays within its PDU capacity times the derating.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=_rack_power, config_schema=_POWER_SCHEMA),
    StackValidationPolicy(
        name="ops-gpu-temperature-alert",
        description="Checks that an alert fires when a GPU runs hotter than the stack's limit (85 C by default).",
        enforcement_level=EnforcementLevel.MANDATORY, validate=_temperature_alert, config_schema=_TEMP_SCHEMA),
    StackValidationPolicy(
        name="ops-burn-in-enabled",
        description="Checks that every node pool of a production environment burns in its nodes.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=_burn_in, config_schema=_BURN_IN_SCHEMA),
    StackValidationPolicy(
        name="ops-uniform-software",
        description="Checks that node pools run the same driver, CUDA and NCCL versions unless a pool opts out.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=_uniform_software),
]
