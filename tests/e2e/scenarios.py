"""What the spec promises each tenant, read from the spec alone, so every stack is covered without new test code."""

from __future__ import annotations

from dataclasses import dataclass

from components.spec import ClusterSpec, NodePool, Tenant


@dataclass(frozen=True)
class Grant:
    """One tenant's GPUs on one pool, in the pool's GPU units (whole GPUs, or slices when shared)."""

    tenant: Tenant
    pool: NodePool
    nominal: int
    borrowable: int          # what it can borrow when the rest of the cohort is idle

    @property
    def id(self) -> str:
        return f"{self.tenant.name}-{self.pool.name}"


def lendable(tenant: Tenant, pool: str) -> int:
    q = tenant.gpu_quota.get(pool)
    if q is None:
        return 0
    return q.nominal if q.lending_limit is None else q.lending_limit


def grants(spec: ClusterSpec) -> list[Grant]:
    """Every (tenant, pool) with GPUs: nominal, and what borrowing can add (its limit, and what others lend)."""
    out = []
    for t in spec.tenants:
        for pool_name, q in t.gpu_quota.items():
            others = sum(lendable(o, pool_name) for o in spec.tenants if o is not t)
            limit = others if q.borrowing_limit is None else min(q.borrowing_limit, others)
            out.append(Grant(t, spec.pools[pool_name], q.nominal, limit))
    return out


def reclaim_pairs(spec: ClusterSpec) -> list[tuple[Grant, Grant]]:
    """(borrower, lender) on the same pool: the borrower can take some of what the lender lends."""
    gs = grants(spec)
    return [(b, lender) for b in gs for lender in gs
            if b.pool.name == lender.pool.name and b.tenant is not lender.tenant and b.borrowable > 0
            and lendable(lender.tenant, lender.pool.name) > 0 and lender.nominal > 0]

