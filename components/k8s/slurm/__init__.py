"""Slurm through Slinky on chosen pools: the charts' values, slurm.conf and its files, accounts, login and database
(cluster.py), and the prolog/epilog node check (node_check.py). Imports the kit and health (the check reads the
detectors' DCGM and NVLink parsers)."""
