"""The Pulumi program: build the environment described by stacks/<stack>.yaml."""

import pulumi

from components import GpuCluster, SpecError, load_spec, trim_stack_traces
from components.spec.cluster import PLATFORM
from components.spec.slurm import DIRECTORY_PASSWORD, directory_password_problem
from components.spec.storage import STORAGE_API_PASSWORD
from components.split import check_platform, part_problem

trim_stack_traces()         # the state keeps each resource's program frames, not the event loop's (issue 55)
config = pulumi.Config()
spec_file = config.get("specFile") or f"stacks/{pulumi.get_stack()}.yaml"
try:
    spec = load_spec(spec_file)
except SpecError as e:          # the engine prints a RunError's message alone, anything else with a traceback
    raise pulumi.RunError(str(e)) from None
# A split environment (README: Split stacks): the platform stack, or one shard's, which reads the platform's.
part, platform_stack = config.get("part") or None, config.get("platformStack") or None
if problem := part_problem(spec, spec_file, part, platform_stack):
    raise pulumi.RunError(problem)
platform = None
if part and platform_stack and part != PLATFORM:
    check_platform(spec, part, platform_stack)
    platform = pulumi.StackReference(platform_stack)
# kubectl, which drains nodes in a rollout, reaches the cluster as the default Kubernetes provider does.
kubernetes = pulumi.Config("kubernetes")
# The Slurm login set's directory account, where the spec names one (kubernetes.slurm.login.directory.bind_dn).
directory_password = config.get_secret(DIRECTORY_PASSWORD)
given = config.get(DIRECTORY_PASSWORD)            # checked here, never printed
if given is not None and (problem := directory_password_problem(given)):
    raise pulumi.RunError(f"the stack's secret {problem}")
if directory_password is None and spec.kubernetes.slurm.secret_settings:
    raise pulumi.RunError("kubernetes.slurm.login.directory.bind_dn needs its password as the stack's secret "
                          "slurmDirectoryPassword: `pulumi config set --secret slurmDirectoryPassword`")
# The storage cluster's API user (storage.weka.api_username, storage.scale.csi.gui_username), where one is needed.
storage_api_password = config.get_secret(STORAGE_API_PASSWORD)
if storage_api_password is None and spec.storage.secret_settings:
    raise pulumi.RunError(f"the storage cluster's API user (storage.weka.api_username or storage.scale.csi."
                          f"gui_username) needs its password as the stack's secret {STORAGE_API_PASSWORD}: "
                          f"`pulumi config set --secret {STORAGE_API_PASSWORD}`")
cluster = GpuCluster(spec.name, spec, ssh_private_key=config.require_secret("sshPrivateKey"),
                     kubeconfig=kubernetes.get_secret("kubeconfig"), kube_context=kubernetes.get("context"),
                     slurm_directory_password=directory_password, part=part, platform=platform,
                     storage_api_password=storage_api_password)

pulumi.export("cluster", spec.name)
pulumi.export("gpus", spec.gpus)
if cluster.fabric is not None:            # not a shard's stack
    pulumi.export("fabricTopology", cluster.fabric.topology)
    pulumi.export("tenantNamespaces", {n: t.namespace for n, t in cluster.tenants.items()})
    pulumi.export("tenantLocalQueues", {n: t.local_queue for n, t in cluster.tenants.items()})
    pulumi.export("rdmaResource", cluster.kubernetes.rdma_resource)
    pulumi.export("tenancy", cluster.tenancy.model_dump(mode="json"))   # for tenants managed in tenants/
pulumi.export("burnIn", {h: v for p in cluster.node_pools.values() for h, v in p.burn_in.items()})
for key, value in cluster.shared.items():          # what the shards' stacks read, in the platform stack
    pulumi.export(key, value)
