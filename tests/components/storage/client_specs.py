"""dev with its BeeGFS swapped for the clients of a site's WEKA or Storage Scale cluster: the specs the client
tests (units, real SSH, the example stacks' plans) start from."""

from __future__ import annotations

import copy
from typing import Any

from tests.conftest import _DEV

WEKA: dict[str, Any] = {
    "kind": "wekafs", "fs_name": "wfs", "mount_point": "/mnt/weka", "datasets": [{"name": "common", "size_gib": 512}],
    "weka": {"backends": ["10.10.0.41", "10.10.0.42"], "api_username": "gpucluster", "client_core_ids": "1",
             "mount_options": ["sync_on_close"], "capacity_tib": 100, "read_gb_per_s": 40}}
SCALE: dict[str, Any] = {
    "kind": "scale", "fs_name": "gpfs0", "mount_point": "/gpfs/gpfs0", "datasets": [{"name": "common", "size_gib": 512}],
    "scale": {"cluster_name": "scale1.example.internal", "cluster_id": "4711471147114711",
              "admin_node": {"hostname": "scale-adm-01", "address": "10.10.0.51"},
              "supported_kernels": ["5.15.0-1*", "6.8.0-*"], "capacity_tib": 100, "read_gb_per_s": 40}}


def with_storage(storage: dict[str, Any], base: dict[str, Any] | None = None, **settings: Any) -> dict[str, Any]:
    """`base` (dev) with `storage`, its weka or scale settings updated with `settings`."""
    data = copy.deepcopy(base or _DEV)
    data["storage"] = copy.deepcopy(storage)
    data["storage"]["weka" if storage["kind"] == "wekafs" else "scale"].update(settings)
    return data
