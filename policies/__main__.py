"""The policy pack's entry point. Constructing PolicyPack starts the analyzer server and never returns,
so this file is the only place it happens; tests import `registry` instead."""

from pulumi_policy import EnforcementLevel, PolicyPack

from registry import POLICIES

PolicyPack(name="gpucluster", enforcement_level=EnforcementLevel.MANDATORY, policies=POLICIES)
