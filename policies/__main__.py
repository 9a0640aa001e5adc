"""The policy pack's entry point: `pulumi preview --policy-pack policies [--policy-pack-config FILE]`.

Constructing PolicyPack starts the analyzer server and never returns, so this file is the only place it happens;
tests and `gpucluster check` import `gpucluster_policies` instead."""

from pulumi_policy import EnforcementLevel, PolicyPack

from gpucluster_policies import POLICIES

PolicyPack(name="gpucluster", enforcement_level=EnforcementLevel.MANDATORY, policies=POLICIES)
