"""Tenancy: a tenant's namespace, RBAC, network policies, quotas and Kueue queues (tenant.py), and the job
templates its users submit (jobs.py), the admission fence around tenants' own secondary networks (networks.py). Imports the kit below it; nothing of the other rooms."""
