"""Which environment variables may travel with a job to another machine: not credentials.

A pod manifest is readable by anyone who can list pods, and a Ray job's runtime env by anyone who can open the
dashboard, so a variable whose name looks like a credential, or a URL with a password in it, never goes into
either: it is left out with a warning that names the variable (never its value). Credentials reach a pod from
Kubernetes secrets (k8s.env_from_secrets) and a Ray job from the cluster's own environment.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from ...engine.runtime.worker import PARENT_PID

# Variables that hold credentials by their name.
SECRET_NAME = re.compile(r"SECRET|PASSWORD|PASSWD|TOKEN|ACCESS_KEY|PRIVATE_KEY|CREDENTIAL|API_KEY", re.I)
URL_PASSWORD = re.compile(r"://[^/@\s:]+:[^/@\s]+@")  # a URL with user:password@ in it


def public_env(
    env: Mapping[str, str],
    warn: Callable[[str], None] = print,
    where: str = "k8s launcher",
    instead: str = "put it in a Kubernetes secret listed in k8s.env_from_secrets",
) -> dict[str, str]:
    """The variables that may be written where others can read them; each credential left out with a warning
    naming it and where to put it instead. The worker's watchdog pid means nothing on another machine: left out."""
    out = {}
    for name, value in env.items():
        if name == PARENT_PID:
            continue
        if SECRET_NAME.search(name) or URL_PASSWORD.search(str(value)):
            warn(f"{where}: {name} looks like a credential and is not put in the job's description; {instead}")
            continue
        out[name] = str(value)
    return out
