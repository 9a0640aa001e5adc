"""Tenants managed apart from the platform: one team's onboarding changes only that team's objects.

The platform stack exports `tenancy` (cluster name, Kueue cohort, pools' capacities and what is already
guaranteed, NCCL settings, namespaces taken); this program reads it through a StackReference, checks the
tenants in stacks/<stack>.yaml against it, and builds one Tenant component per team. Fabric, nodes and
storage are never part of this program.
"""

import pulumi

from components import Tenant, TenantArgs
from components.spec import SpecError
from components.spec.loader import load_tenants, read_tenancy
from components.spec.tenants import tenancy_problems

config = pulumi.Config()
try:
    tenants = load_tenants(config.get("tenantsFile") or f"stacks/{pulumi.get_stack()}.yaml")
except SpecError as e:          # the engine prints a RunError's message alone, anything else with a traceback
    raise pulumi.RunError(str(e)) from None
platform = pulumi.StackReference(tenants.spec.platform_stack)


def onboard(exported: object) -> dict:
    try:
        tenancy = read_tenancy(exported, tenants)
        problems = tenancy_problems(tenancy, tenants.spec.tenants)
        if problems:
            raise tenants.error(problems)
    except SpecError as e:
        raise pulumi.RunError(str(e)) from None
    return {t.name: Tenant(f"{tenancy.cluster}-{t.name}", TenantArgs.from_tenancy(tenancy, t)).namespace
            for t in tenants.spec.tenants}


pulumi.export("tenantNamespaces", platform.get_output("tenancy").apply(onboard))
