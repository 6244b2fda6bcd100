"""The worker's Kubernetes pod: its settings (`K8sPod`, the training resource's `k8s:`) and the manifest built from
them.

`pod_spec` and `pod_meta` are the pieces the k8s launcher (k8s.py) hands dagster-k8s's Pipes client; `render_pod`
returns the whole manifest exactly as dagster-k8s would submit it (its own `build_pod_body`), for tests and for
people: `dragon k8s-pod pod.yaml` prints it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from dagster import Config
from pydantic import Field

from .credentials import public_env

WORKER_CONTAINER = "worker"
LAUNCH_LABEL = "dragon-dagster/launch"  # one value per run_pod call: how run_pod finds its own pod again
CONTEXT_PLACEHOLDER = "<set per run: the Dagster run's context, encoded by Dagster Pipes>"


class K8sPod(Config):
    """Where and how the worker pod runs. Credentials come from secrets (env_from_secrets), never from here."""

    image: str = Field(
        default="",
        description="Container image with dragon-dagster (and its training extras) "
        "installed; `python` on its PATH runs the worker.",
    )
    namespace: str = Field(
        default="",
        description="Namespace for the pod. Empty: the one Dagster runs in "
        "(in-cluster), else the kubeconfig context's, else default.",
    )
    image_pull_policy: Literal["IfNotPresent", "Always", "Never"] = Field(
        default="IfNotPresent", description="The container's imagePullPolicy."
    )
    service_account_name: str = Field(
        default="", description="Service account of the pod. Empty: the namespace's default."
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict,
        description="Node labels the pod must land on, e.g. {'nvidia.com/gpu.product': 'NVIDIA-H100-80GB-HBM3'}.",
    )
    tolerations: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Kubernetes tolerations, e.g. [{key: nvidia.com/gpu, operator: Exists, "
        "effect: NoSchedule}] for tainted GPU nodes.",
    )
    volumes: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Kubernetes volume specs, e.g. [{name: runs, persistentVolumeClaim: "
        "{claimName: dragon-runs}}]: the runs dir the job file and artifacts "
        "live in.",
    )
    volume_mounts: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Mounts of the worker container, e.g. [{name: runs, mountPath: /runs}]; "
        "the runs dir must have the same path as in the Dagster step.",
    )
    env_from_secrets: list[str] = Field(
        default_factory=list,
        description="Names of secrets whose keys become the worker's environment "
        "(MLflow and S3 credentials: AWS_ACCESS_KEY_ID, MLFLOW_TRACKING_TOKEN..).",
    )
    gpu_resource: str = Field(
        default="nvidia.com/gpu",
        description="Extended resource the GPUs are requested as (amd.com/gpu, a MIG profile, ...).",
    )
    shm_size_gb: float = Field(
        default=0,
        ge=0,
        description="Size of a memory-backed /dev/shm, GiB (counts "
        "against memory_gb). Containers get 64 MiB, too "
        "little for NCCL with several GPUs (torchrun, "
        "workers > 1) or DataLoader workers. 0: none.",
    )
    pod_labels: dict[str, str] = Field(default_factory=dict, description="Extra labels of the pod.")
    pod_annotations: dict[str, str] = Field(default_factory=dict, description="Extra annotations of the pod.")
    kubeconfig_file: str = Field(
        default="", description="kubeconfig to use. Empty: $KUBECONFIG or ~/.kube/config, or the in-cluster config."
    )
    kube_context: str = Field(default="", description="Context in the kubeconfig. Empty: its current one.")
    load_incluster_config: bool = Field(
        default=False,
        description="Use the service account of the pod Dagster runs in. False: a kubeconfig "
        "if one is set, else in-cluster when KUBERNETES_SERVICE_HOST is set.",
    )
    connect_timeout_s: float = Field(
        default=10, description="How long to wait for the API server before the step fails, not hangs."
    )
    poll_interval_s: float = Field(default=5, description="Seconds between pod status polls.")
    pod_wait_timeout_s: float = Field(
        default=7 * 86400, description="Longest a pod may run (queueing for a node included). 0: no limit."
    )


def _quantity_cpu(cpus: float) -> str:
    return str(int(cpus)) if float(cpus).is_integer() else f"{math.ceil(cpus * 1000)}m"


def _whole_gpus(gpus: float) -> int:
    if gpus < 0 or not float(gpus).is_integer():
        raise ValueError(
            f"gpus={gpus}: Kubernetes hands out whole devices; for a slice of one, set "
            "gpu_resource to the MIG profile or time-sliced resource your cluster offers"
        )
    return int(gpus)


def pod_spec(pod: K8sPod, *, cpus: float, gpus: float, memory_gb: float, termination_grace_s: float = 600) -> dict:
    """The base pod spec (camelCase, as in a manifest) that PipesK8sClient completes with image, command and
    the Pipes environment: resources, volumes, scheduling, secrets and the stop grace period."""
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if cpus > 0:
        requests["cpu"] = _quantity_cpu(cpus)
    if memory_gb > 0:
        # limit == request: a worker past its size is OOMKilled at a known point, not when the node fills
        requests["memory"] = limits["memory"] = (
            f"{int(memory_gb)}Gi" if float(memory_gb).is_integer() else f"{math.ceil(memory_gb * 1024)}Mi"
        )
    n_gpus = _whole_gpus(gpus)
    if n_gpus:
        limits[pod.gpu_resource] = str(n_gpus)  # extended resources: the request defaults to the limit
    container: dict[str, Any] = {
        "name": WORKER_CONTAINER,
        "imagePullPolicy": pod.image_pull_policy,
        "resources": {k: v for k, v in (("requests", requests), ("limits", limits)) if v},
    }
    volumes = [dict(v) for v in pod.volumes]
    mounts = [dict(m) for m in pod.volume_mounts]
    if pod.shm_size_gb > 0:
        volumes.append(
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{math.ceil(pod.shm_size_gb * 1024)}Mi"}}
        )
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    if mounts:
        container["volumeMounts"] = mounts
    if pod.env_from_secrets:
        container["envFrom"] = [{"secretRef": {"name": name}} for name in pod.env_from_secrets]
    spec: dict[str, Any] = {
        "containers": [container],
        "restartPolicy": "Never",  # a failed job is Dagster's to retry, with its checkpoint, not the kubelet's
        # SIGTERM, then this long to save a checkpoint before SIGKILL (see the module docstring)
        "terminationGracePeriodSeconds": int(math.ceil(termination_grace_s)),
    }
    if pod.pod_wait_timeout_s > 0:  # dagster-k8s follows the log until the container exits: the kubelet ends
        spec["activeDeadlineSeconds"] = int(pod.pod_wait_timeout_s)  # a pod that hangs past the limit
    if volumes:
        spec["volumes"] = volumes
    if pod.node_selector:
        spec["nodeSelector"] = dict(pod.node_selector)
    if pod.tolerations:
        spec["tolerations"] = [dict(t) for t in pod.tolerations]
    if pod.service_account_name:
        spec["serviceAccountName"] = pod.service_account_name
    return spec


def pod_meta(pod: K8sPod, launch_id: str = "") -> dict:
    labels = {**pod.pod_labels, "app.kubernetes.io/name": "dragon-dagster-worker"}
    if launch_id:
        labels[LAUNCH_LABEL] = launch_id
    meta: dict[str, Any] = {"labels": labels}
    if pod.pod_annotations:
        meta["annotations"] = dict(pod.pod_annotations)
    return meta


def _messages_env() -> dict[str, str]:
    """DAGSTER_PIPES_MESSAGES as the pod-log reader sets it (its real value: where the worker writes)."""
    from dagster_k8s.pipes import PipesK8sPodLogsMessageReader
    from dagster_pipes import DAGSTER_PIPES_MESSAGES_ENV_VAR, encode_env_var

    with PipesK8sPodLogsMessageReader().read_messages(handler=None) as params:  # type: ignore[arg-type]
        return {DAGSTER_PIPES_MESSAGES_ENV_VAR: encode_env_var(params)}


def render_pod(
    pod: K8sPod,
    command: Sequence[str],
    env: Mapping[str, str] | None = None,
    *,
    cpus: float,
    gpus: float,
    memory_gb: float,
    termination_grace_s: float = 600,
    bootstrap_env: Mapping[str, str] | None = None,
    pod_name: str = "dragon-worker",
    warn: Callable[[str], None] = print,
) -> dict:
    """The pod manifest (apiVersion, kind, metadata, spec; camelCase) as PipesK8sClient.run submits it: built
    by dagster-k8s's own build_pod_body from the same pieces run_pod hands it. bootstrap_env: the Pipes
    variables of a session; by default DAGSTER_PIPES_MESSAGES as the log reader sets it and a placeholder
    for the context, which only a running Dagster step has."""
    import kubernetes
    from dagster_k8s.pipes import build_pod_body
    from dagster_pipes import DAGSTER_PIPES_CONTEXT_ENV_VAR

    if bootstrap_env is None:
        bootstrap_env = {DAGSTER_PIPES_CONTEXT_ENV_VAR: CONTEXT_PLACEHOLDER, **_messages_env()}
    body = build_pod_body(
        pod_name=pod_name,
        image=pod.image or None,
        command=list(command),
        env_vars={**bootstrap_env, **public_env(env or {}, warn)},  # the order PipesK8sClient.run merges them in
        base_pod_meta=pod_meta(pod),
        base_pod_spec=pod_spec(pod, cpus=cpus, gpus=gpus, memory_gb=memory_gb, termination_grace_s=termination_grace_s),
    )
    manifest = kubernetes.client.ApiClient().sanitize_for_serialization(body)
    manifest["metadata"]["namespace"] = pod.namespace or "default"
    return {"apiVersion": "v1", "kind": "Pod", **manifest}
