"""The gpucluster policy pack's policies, by domain. Importing this starts nothing; `../__main__.py` builds the
PolicyPack (which serves until killed), and `gpucluster check` runs these offline with the SDK's own analyzer."""

from .fabric import FABRIC_POLICIES
from .kubernetes import KUBERNETES_POLICIES
from .operations import OPERATIONS_POLICIES
from .ssh import SSH_POLICIES
from .storage import STORAGE_POLICIES
from .tenancy import TENANCY_POLICIES

POLICIES = [*KUBERNETES_POLICIES, *TENANCY_POLICIES, *FABRIC_POLICIES, *SSH_POLICIES, *STORAGE_POLICIES,
            *OPERATIONS_POLICIES]
