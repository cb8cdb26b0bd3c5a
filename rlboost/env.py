"""The one module that reads environment variables; everything else asks it.

Every variable listed here is documented in README.md ("Environment variables").
"""

from __future__ import annotations

import os

_PREFIX = "RLBOOST_"


def get(name: str, default: str | None = None) -> str | None:
    """Return the RLBOOST_<name> variable, or default when unset or empty."""
    value = os.environ.get(_PREFIX + name, "")
    return value if value else default


def secret() -> bytes | None:
    """Shared secret for weight-server authentication (RLBOOST_SECRET)."""
    value = get("SECRET")
    return value.encode() if value is not None else None


def transport() -> str | None:
    """Transport override for weight pulls (RLBOOST_TRANSPORT: auto, tcp, shm, ucx)."""
    return get("TRANSPORT")


def run_root() -> str:
    """Where `rlboost train` puts run directories (RLBOOST_RUN_ROOT, default ./runs)."""
    return get("RUN_ROOT", "runs")


def cache_dir() -> str:
    """Cache for converted checkpoints (RLBOOST_CACHE, default ~/.cache/rlboost)."""
    return get("CACHE", os.path.join(os.path.expanduser("~"), ".cache", "rlboost"))
