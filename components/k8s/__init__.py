from .tenant import Tenant, TenantArgs

__all__ = ["Tenant", "TenantArgs"]
