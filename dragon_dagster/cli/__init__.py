"""`dragon`: what people do outside the Dagster UI: the demo, chatting, the studio, generating, comparing and
listing runs, serving. One module a group of commands (demo, chat, deploy, models, runs, serve), the group and its
error policy in group.py, what they share in common.py."""

from . import chat, demo, deploy, models, runs, serve  # noqa: F401 - each registers its commands on main
from .common import PROJECT_DAGSTER_YAML, console, ensure_dagster_home, resolve_target, runs_dir
from .demo import evaluation_link
from .group import main

__all__ = [
    "PROJECT_DAGSTER_YAML",
    "console",
    "ensure_dagster_home",
    "evaluation_link",
    "main",
    "resolve_target",
    "runs_dir",
]
