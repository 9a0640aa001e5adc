"""Kubernetes quantities written as the apiserver writes them back.

resource.Quantity serialises in its canonical form: zero bare ("0"), else the largest binary suffix that keeps
the number whole ("2048Gi" reads back "2Ti"). The apiserver (and Kueue's webhooks, which decode and re-encode
what they admit) returns that form, so a quantity rendered any other way reads back changed and every
`pulumi preview` after an up shows a diff that is no change. Found under the real engine (issue 54).
"""

from __future__ import annotations

_BINARY = ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei")


def binary(n: int, unit: str) -> str:
    """`n` of `unit` (Ki, Mi, Gi, ...) in the canonical form."""
    if n == 0:
        return "0"
    i = _BINARY.index(unit)
    while i + 1 < len(_BINARY) and n % 1024 == 0:
        n, i = n // 1024, i + 1
    return f"{n}{_BINARY[i]}"


def cpu(text: str) -> str:
    """A CPU amount ("0.5", "500m", "2") in the canonical form: whole cores bare, else millicores ("500m")."""
    milli = round(float(text[:-1]) if text.endswith("m") else float(text) * 1000)
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"
