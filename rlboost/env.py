"""The one module that reads environment variables; everything else asks it.

Every variable listed here is documented in README.md ("Environment variables").
"""

from __future__ import annotations

import os
import shlex

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
    """Where `rlboost train` puts run directories (RLBOOST_RUN_ROOT, default ./runs), absolute."""
    return os.path.abspath(get("RUN_ROOT", "runs"))


def cache_dir() -> str:
    """Cache for converted checkpoints (RLBOOST_CACHE, default ~/.cache/rlboost), absolute."""
    return os.path.abspath(os.path.expanduser(get("CACHE", os.path.join("~", ".cache", "rlboost"))))


def extra_overrides() -> list[str]:
    """Config overrides applied after the command line's --set ones (RLBOOST_SET: KEY=VALUE
    assignments separated by spaces, e.g. "run.steps=2 run.progress=false")."""
    value = get("SET")
    return shlex.split(value) if value else []


def runtime_dir() -> str | None:
    """The user's own runtime folder (XDG_RUNTIME_DIR, e.g. /run/user/1000, made by the login
    manager and closed to others): where a node's notice socket goes. None when unset."""
    return os.environ.get("XDG_RUNTIME_DIR") or None


def ray_address() -> str | None:
    """Ray cluster for `rlboost train` to join (RLBOOST_RAY_ADDRESS); None starts a local one."""
    return get("RAY_ADDRESS")


# Without this, a local Ray cluster binds to the machine's non-loopback address.
RAY_LOOPBACK_VARIABLE = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
# Ray reports usage statistics to its maintainers' server unless told not to; a run sends
# nothing to any address it was not given.
RAY_USAGE_STATS_VARIABLE = "RAY_USAGE_STATS_ENABLED"
# Ray starts its workers at nice 15, below the driver and anything else on the host; a run's
# actors (trainer ranks, engines, controller) are its work, and on a shared host they starved
# behind any busy process (a start-up that takes minutes, a heartbeat missed).
RAY_WORKER_NICENESS_VARIABLE = "RAY_worker_niceness"
_RAY_DEFAULTS = {RAY_LOOPBACK_VARIABLE: "0", RAY_USAGE_STATS_VARIABLE: "0", RAY_WORKER_NICENESS_VARIABLE: "0"}
# transformers and huggingface_hub must not try to reach a model hub for local directories.
_HF_DEFAULTS = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def apply_ray_defaults() -> dict[str, str]:
    """Set Ray's environment for a local cluster (existing values win); call before ray.init.
    Returns the values now in force (the user's where set)."""
    for key, value in _RAY_DEFAULTS.items():
        os.environ.setdefault(key, value)
    return {key: os.environ[key] for key in _RAY_DEFAULTS}


def ray_auth_mode() -> str | None:
    """Ray's token authentication mode (RAY_AUTH_MODE: token or disabled), None when unset."""
    return os.environ.get("RAY_AUTH_MODE") or None


def apply_ray_auth_default() -> None:
    """A run that joins a Ray cluster speaks to it with Ray's token authentication
    (RAY_AUTH_MODE=token) unless RAY_AUTH_MODE says otherwise; Ray 2.60 turns it on by itself
    only for a cluster that ray.init() starts. The token comes from RAY_AUTH_TOKEN,
    RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token, as Ray reads it."""
    os.environ.setdefault("RAY_AUTH_MODE", "token")


def apply_hf_defaults() -> None:
    """Keep transformers offline (existing values win); call before importing it."""
    for key, value in _HF_DEFAULTS.items():
        os.environ.setdefault(key, value)
