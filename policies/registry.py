"""Every policy of the pack, in one list."""

from tenancy import TENANCY_POLICIES

POLICIES = [*TENANCY_POLICIES]
