"""The platform's operators: pure renderers of the GPU Operator's, Network Operator's, NFD's, Kueue's and the MPI
operator's values and objects, and monitoring (alerts and dashboards over every room's conditions, so it sits
above health and slurm)."""
