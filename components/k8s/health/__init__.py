"""Runtime health: the node-problem-detector plugins and their records (detector.py), the NVML detector (nvml.py),
the quarantine rule and its breaker (quarantine.py), the active DCGM and NCCL checks between jobs (checks.py).
Imports the kit, tenancy (the checks are Kueue jobs), and the hosts' records below Kubernetes."""
