"""Spec strings are quoted where they leave for a script: even values validation would refuse run nothing.

Validation holds every script-bound string to its grammar (tests/spec/test_bad_input.py); these tests take that
away (models copied without validation) and run the rendered scripts on real SSH test hosts, to prove the
scripts themselves never let a spec value be read as shell.
"""

from __future__ import annotations

import pytest

from components.fabric.host import render_fabric_host
from components.fabric.nccl import nccl_envs
from components.nodes import NodePoolArgs
from components.nodes.burn_in import render_burn_in
from components.nodes.node_pool import render_preparation
from components.ssh import as_command
from tests.realssh.test_node_scripts import spec_of

CANARY = "/var/lib/gpucluster-injected"
# One word each: a value that breaks the script's syntax would stop bash before it ran anything at all.
PAYLOADS = (f"x$(touch {CANARY})", f"x`touch {CANARY}`", f"x;touch {CANARY}", f"x'$(touch {CANARY})'",
            f'x"$(touch {CANARY})"', f"x\ntouch {CANARY}")


def nothing_ran(host, out) -> None:
    assert not host.exists(CANARY), f"a spec value ran as shell:\n{out.stdout}\n{out.stderr}"


@pytest.mark.parametrize("payload", PAYLOADS)
def test_host_preparation_and_burn_in_run_no_spec_value(test_hosts, payload):
    host = test_hosts.hosts["gpu-dev-02"]
    spec = spec_of(kubelet_cpu_manager_static=True)
    pool = spec.node_pools[0]
    pool = pool.model_copy(update={
        "tuning": pool.tuning.model_copy(update={"kubelet_reserved_cpus": payload}),
        "burn_in": pool.burn_in.model_copy(update={"nccl_tests_dir": payload})})
    target = pool.hosts[1].model_copy(update={"hostname": payload})
    for script in (render_preparation(NodePoolArgs.from_spec(spec, pool), target), render_burn_in(pool, target)):
        for text in (script.create, script.delete):
            if text:
                nothing_ran(host, test_hosts.ssh(host, as_command(text, "root")))


@pytest.mark.parametrize("payload", PAYLOADS)
def test_the_fabric_script_runs_no_spec_value(test_hosts, payload):
    host = test_hosts.hosts["gpu-dev-02"]
    spec = spec_of()
    pool = spec.node_pools[0]
    nics = [n.model_copy(update={"interface": f"{payload}{n.rail}", "device": f"{payload}{n.rail}"})
            for n in pool.nics]
    env = {**nccl_envs(spec)[pool.name], "NCCL_SOCKET_IFNAME": payload}
    script = render_fabric_host(spec, payload, nics, env)
    for text in (script.create, script.delete):
        nothing_ran(host, test_hosts.ssh(host, as_command(text, "root")))


@pytest.mark.parametrize("payload", PAYLOADS)
def test_switch_scripts_run_no_port_name(test_hosts, payload):
    """Every backend, with no-op stand-ins for the switch CLIs (nv, config, sonic-db-cli, FastCli)."""
    from components.fabric.switches import BACKENDS, render_switch

    host = test_hosts.hosts["gpu-dev-03"]
    for tool in ("nv", "config", "sonic-db-cli", "FastCli"):
        host.sh(f"printf '#!/bin/sh\\nexit 0\\n' > /usr/local/bin/{tool} && chmod +x /usr/local/bin/{tool}")
    spec = spec_of()
    switch = spec.fabric.switches[0]
    for vendor in BACKENDS:
        hostile = switch.model_copy(update={"vendor": vendor, "ports": 2, "port_names": [payload, f"swp1{payload}"]})
        nothing_ran(host, test_hosts.ssh(host, as_command(render_switch(hostile, spec.fabric).create, "root")))
