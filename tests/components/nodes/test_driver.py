"""The driver stack as desired state: which packages a spec pins, where from, and who installs them (real apt runs
them in tests/realssh/test_driver_stack.py)."""

from __future__ import annotations

import yaml

from components.nodes import NodePoolArgs
from components.nodes.burn_in import burn_in_identity
from components.nodes.driver import APT_PIN, YUM_REPO, parts, render_driver_stack
from components.nodes.node_pool import render_pool_preparation, render_preparation
from components.nodes.rollout import owed_restarts
from components.spec import parse_spec
from components.spec.hardware import Software
from components.ssh import digest
from tests.components.nodes.test_scripts import MIRRORS


def software(**fields):
    return Software.model_validate({"package_repositories": MIRRORS, **fields})


def test_the_driver_is_found_under_each_name_its_branch_has_and_fabric_manager_only_with_nvswitch():
    (driver,) = parts(software(driver_version="570.124.06"), nvswitch=False)
    assert driver.deb.split() == ["nvidia-open-570", "nvidia-driver-570-server-open", "nvidia-driver-570-open",
                                  "nvidia-open"]
    assert driver.rpm == "nvidia-open"
    closed, fm, doca = parts(software(driver_version="580.95.05", driver_kernel_modules="proprietary",
                                      doca_ofed_version="2.9.5"), nvswitch=True)
    assert closed.deb.split() == ["cuda-drivers-580", "nvidia-driver-580-server", "nvidia-driver-580", "cuda-drivers"]
    assert (fm.what, fm.version, fm.deb) == ("Fabric Manager", "580.95.05",
                                             "nvidia-fabricmanager-580 nvidia-fabricmanager")   # the driver's own
    assert (doca.what, doca.version, doca.deb, doca.rpm) == ("DOCA-OFED", "2.9.5", "doca-ofed", "doca-ofed")


def test_without_repositories_versions_are_only_checked():
    assert render_driver_stack(Software(driver_version="570.124.06"), nvswitch=True) is None


def test_every_repository_of_the_hosts_family_is_written_and_apt_pins_the_drivers_version():
    stack = render_driver_stack(software(driver_version="570.124.06", doca_ofed_version="2.9.5"), nvswitch=True)
    text = stack.functions
    assert ("deb [signed-by=/etc/apt/keyrings/gpucluster-driver-stack.asc] "
            "https://mirror.example.internal/cuda/ubuntu2204/x86_64 ./\n"
            "deb [trusted=yes] https://mirror.example.internal/doca/2.9.5/ubuntu22.04/x86_64 ./") in text
    assert ("curl -fsSL --create-dirs -o /etc/apt/keyrings/gpucluster-driver-stack.asc "
            "https://mirror.example.internal/cuda/ubuntu2204/x86_64/3bf863cc.pub") in text
    assert "[gpucluster-driver-stack]\nname=gpucluster driver stack\nbaseurl=https://mirror.example.internal/cuda/" \
        "rhel9/x86_64\nenabled=1\ngpgcheck=0" in text and YUM_REPO in text
    assert f"put_file {APT_PIN} 0644 'Package: *nvidia* cuda-drivers* libxnvctrl*\nPin: version " \
           "/^([0-9]+:)?570\\.124\\.06-/\nPin-Priority: 1001'" in text
    assert "stack_part 'the NVIDIA driver' 570.124.06" in text and "stack_part 'Fabric Manager' 570.124.06" in text
    doca_only = render_driver_stack(software(doca_ofed_version="2.9.5"), nvswitch=True).functions
    assert f"drop_file {APT_PIN}" in doca_only and "stack_part DOCA-OFED 2.9.5 doca-ofed doca-ofed" in doca_only
    assert "'the NVIDIA driver'" not in doca_only


def pool_args(dev_data, **software_fields):
    dev_data["node_pools"][0]["software"] = software_fields
    spec = parse_spec(yaml.safe_dump(dev_data))
    return NodePoolArgs.from_spec(spec, spec.node_pools[0])


def test_preparation_installs_where_nobody_works_and_the_rollout_where_someone_does(dev_data):
    args = pool_args(dev_data, driver_version="570.124.06", package_repositories=MIRRORS)
    prep = render_pool_preparation(args)
    assert "stack_files\nif stack_due; then\n  restart=(driver)\n  defer_if_busy" in prep.create
    assert prep.create.index("stack_due") < prep.create.index("need nvidia-smi")   # installed before it is needed
    assert "for unit in driver fabric hugepages containerd kubelet; do if owed" in prep.roll
    assert "stack_apply" in prep.roll and "apt-mark hold" in prep.roll              # and held once installed
    assert owed_restarts("gpu-dev-01: rollout owed: driver kubelet\n") == "driver kubelet"
    plain = render_pool_preparation(pool_args(dev_data, driver_version="570.124.06"))
    assert "stack_apply()" not in plain.create + plain.roll and "\npaid restart-driver\n" in plain.create
    assert f"drop_file {APT_PIN}\n" in plain.create         # an earlier spec's pin would hold apt to its version


def test_a_new_driver_version_rolls_the_pool_and_keeps_its_burn_in(dev_data):
    before = pool_args(dev_data, driver_version="570.124.06", package_repositories=MIRRORS)
    after = pool_args(dev_data, driver_version="570.133.20", package_repositories=MIRRORS)
    host = before.pool.hosts[0]
    assert digest(render_preparation(before, host)) != digest(render_preparation(after, host))
    assert burn_in_identity(before.pool, host) == burn_in_identity(after.pool, host)
