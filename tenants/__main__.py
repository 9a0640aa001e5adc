"""Tenants managed apart from the platform: one team's onboarding changes only that team's objects.

The platform stack exports `tenancy` (cluster name, Kueue cohort, pools' capacities and what is already
guaranteed, NCCL settings, namespaces taken); this program reads it through a StackReference, checks the
tenants in stacks/<stack>.yaml against it, and builds one Tenant component per team. Fabric, nodes and
storage are never part of this program.
"""

import pulumi

from components.k8s.tenant import Tenant, TenantArgs
from components.spec import SpecError
from components.spec.loader import load_tenants
from components.spec.tenants import Tenancy, tenancy_problems

config = pulumi.Config()
source = config.get("tenantsFile") or f"stacks/{pulumi.get_stack()}.yaml"
spec = load_tenants(source)
platform = pulumi.StackReference(spec.platform_stack)


def onboard(exported: dict) -> dict:
    tenancy = Tenancy.model_validate(exported, strict=False)   # numbers cross the wire as doubles
    problems = tenancy_problems(tenancy, spec.tenants)
    if problems:
        raise SpecError(source, [f"{source}: {p}" for p in problems])
    return {t.name: Tenant(f"{tenancy.cluster}-{t.name}", TenantArgs.from_tenancy(tenancy, t)).namespace
            for t in spec.tenants}


pulumi.export("tenantNamespaces", platform.require_output("tenancy").apply(onboard))
