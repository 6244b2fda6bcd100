"""Where a worker runs, by name: the training resource's `launcher` setting picks one of LAUNCHERS; each runs the
same worker command and job file and speaks Dagster Pipes, so a job behaves the same wherever it runs."""

from .base import Launcher, PipesTap
from .k8s import K8sLauncher
from .ray import RayLauncher
from .subprocess import SubprocessLauncher

LAUNCHERS: dict[str, type[Launcher]] = {
    launcher.name: launcher for launcher in (SubprocessLauncher, RayLauncher, K8sLauncher)
}

__all__ = ["LAUNCHERS", "Launcher", "PipesTap"]
