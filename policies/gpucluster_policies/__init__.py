"""The gpucluster policy pack's policies, by domain. Importing this starts nothing; `../__main__.py` builds the
PolicyPack (which serves until killed), and `gpucluster check` runs these offline with the SDK's own analyzer.
Importing it does one thing to that analyzer, on both paths: strings inside Pulumi secrets reach policies marked
(common.mark_secrets)."""

from .common import mark_secrets
from .fabric import FABRIC_POLICIES
from .kubernetes import KUBERNETES_POLICIES
from .operations import OPERATIONS_POLICIES
from .ssh import SSH_POLICIES
from .storage import STORAGE_POLICIES
from .tenancy import TENANCY_POLICIES

mark_secrets()

POLICIES = [*KUBERNETES_POLICIES, *TENANCY_POLICIES, *FABRIC_POLICIES, *SSH_POLICIES, *STORAGE_POLICIES,
            *OPERATIONS_POLICIES]
