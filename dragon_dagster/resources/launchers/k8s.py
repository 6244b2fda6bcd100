"""The `k8s` launcher: the worker as a Kubernetes pod, through dagster-k8s's Pipes client.

The pod runs the same `python -m dragon_dagster.engine.runtime.worker RUN.json` command as the subprocess launcher.
The Dagster context reaches it in an environment variable; the worker's Pipes messages (log lines, step
metrics, the outcome) come back in the pod's log, read by dagster-k8s's PipesK8sPodLogsMessageReader, which
the training resource wraps in its PipesTap. Nothing else crosses over: the job file and the artifact it
writes live on a volume that the Dagster step and the pod mount at the same path (a PVC holding the runs
dir), and credentials come from Kubernetes secrets (`env_from_secrets`), never from config or this process's
environment.

Stopping: a terminated Dagster run deletes the pod with a grace period of `termination_grace_s`; the kubelet
sends the worker SIGTERM (a trainer saves a checkpoint) and kills it when the grace period is over.

The pod itself (its settings and manifest) is k8s_pod.py's.
"""

from __future__ import annotations

import math
import os
import uuid
from collections.abc import Callable, Mapping, Sequence
from contextlib import contextmanager
from typing import ClassVar

from dagster import Failure, PipesMessageReader

from ...engine.runtime.execution import EXIT_CANCELLED, EXIT_FAILED
from .base import WorkerState, record_worker
from .credentials import public_env
from .k8s_pod import LAUNCH_LABEL, WORKER_CONTAINER, K8sPod, pod_meta, pod_spec


def _client_configuration(pod: K8sPod):
    """A kubernetes client Configuration loaded the way PipesK8sClient loads its own (its _load_k8s_config),
    kept apart from the global default so that the reachability check can bound its timeouts."""
    import kubernetes

    cfg = kubernetes.client.Configuration()
    incluster = pod.load_incluster_config or (
        not pod.kubeconfig_file and not pod.kube_context and bool(os.getenv("KUBERNETES_SERVICE_HOST"))
    )
    if incluster:
        kubernetes.config.load_incluster_config(client_configuration=cfg)
        source = "the in-cluster service account"
    else:
        kubernetes.config.load_kube_config(
            config_file=pod.kubeconfig_file or None, context=pod.kube_context or None, client_configuration=cfg
        )
        source = f"kubeconfig {pod.kubeconfig_file or os.environ.get('KUBECONFIG') or '~/.kube/config'}" + (
            f", context {pod.kube_context}" if pod.kube_context else ""
        )
    return cfg, source


def check_cluster(pod: K8sPod) -> str:
    """The API server's address once it has answered; a Failure naming it (and where its address came from)
    when there is no configuration or no answer within connect_timeout_s. PipesK8sClient itself waits with
    no timeout, so without this a step against a dead endpoint could hang instead of failing."""
    import kubernetes
    import urllib3

    try:
        cfg, source = _client_configuration(pod)
    except (kubernetes.config.ConfigException, OSError, TypeError, ValueError) as exc:
        raise Failure(
            description=f"k8s launcher: no usable Kubernetes configuration "
            f"(kubeconfig_file={pod.kubeconfig_file!r}, load_incluster_config="
            f"{pod.load_incluster_config}): {exc}"
        ) from exc
    cfg.retries = 0  # one bounded try: a refused or silent endpoint fails the step at once
    api = kubernetes.client.ApiClient(cfg)
    timeout = (pod.connect_timeout_s, pod.connect_timeout_s)
    try:
        kubernetes.client.VersionApi(api).get_code(_request_timeout=timeout)
    except kubernetes.client.ApiException as exc:
        if exc.status in (401, 403):  # reachable, but these credentials will not create pods either
            raise Failure(
                description=f"k8s launcher: the Kubernetes API server at {cfg.host} ({source}) "
                f"refused the credentials: {exc.status} {exc.reason}"
            ) from exc
        # any other answer: the server is there; what it thinks of the pod, run_pod's create call will say
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise Failure(
            description=f"k8s launcher: cannot reach the Kubernetes API server at {cfg.host} "
            f"({source}) within {pod.connect_timeout_s:g} s: {exc}"
        ) from exc
    finally:
        api.close()
    return cfg.host


def _tapped_client_class():
    """PipesK8sClient, reading the pod's log through a wrapped reader (dagster-k8s is an optional extra,
    hence the class is made on first use)."""
    from dagster_k8s.pipes import PipesK8sClient, PipesK8sPodLogsMessageReader

    def logs_reader(reader):
        inner = reader
        while not isinstance(inner, PipesK8sPodLogsMessageReader) and hasattr(inner, "reader"):
            inner = inner.reader
        return inner if isinstance(inner, PipesK8sPodLogsMessageReader) else reader

    class TappedK8sClient(PipesK8sClient):
        """PipesK8sClient streams the pod's log only when its message_reader *is* a
        PipesK8sPodLogsMessageReader (an isinstance check), which a wrapping reader (the resource's PipesTap)
        is not. Here the log is consumed by the reader inside the wrapping: the session opened the wrapper,
        so that reader's handler is the wrapper's, and every message still passes through the tap first."""

        @contextmanager
        def consume_pod_logs(self, *args, **kwargs):
            outer = self.message_reader
            self.message_reader = logs_reader(outer)  # read only by the base method (isinstance, the calls)
            try:
                with super().consume_pod_logs(*args, **kwargs):  # entered here: the base reads it on entry
                    yield
            finally:
                self.message_reader = outer

    return TappedK8sClient


def run_pod(
    context,
    pod: K8sPod,
    command: Sequence[str],
    env: Mapping[str, str],
    wrap_reader: Callable[[PipesMessageReader], PipesMessageReader] = lambda reader: reader,
    *,
    cpus: float,
    gpus: float,
    memory_gb: float,
    termination_grace_s: float = 600,
) -> int:
    """Run command in a pod of pod.image and wait for it; the worker's exit code.

    0 on success; the worker's own failure codes (it failed or was cancelled and said why in its outcome
    message) are returned for the caller to report. Anything else (the API server unreachable, the image not
    pulled, the pod unschedulable, OOMKilled, evicted) raises a Failure that names the pod and the reason.
    cpus: CPU request (0: none); gpus: whole devices as pod.gpu_resource; memory_gb: request and limit
    (0: none); termination_grace_s: how long a deleted pod's trainer has to save its checkpoint."""
    import kubernetes
    from dagster_k8s.client import DagsterK8sError, DagsterKubernetesClient
    from dagster_k8s.pipes import PipesK8sPodLogsMessageReader
    from dagster_k8s.utils import detect_current_namespace

    if not pod.image:
        raise Failure(description="k8s launcher: k8s.image is not set (an image with dragon-dagster installed)")
    endpoint = check_cluster(pod)
    namespace = pod.namespace or detect_current_namespace(pod.kubeconfig_file or None) or "default"
    launch_id = uuid.uuid4().hex[:16]
    client = _tapped_client_class()(
        message_reader=wrap_reader(PipesK8sPodLogsMessageReader()),
        load_incluster_config=True if pod.load_incluster_config else None,
        kubeconfig_file=pod.kubeconfig_file or None,
        kube_context=pod.kube_context or None,
        poll_interval=float(pod.poll_interval_s),
    )
    spec = pod_spec(pod, cpus=cpus, gpus=gpus, memory_gb=memory_gb, termination_grace_s=termination_grace_s)
    context.log.info(
        f"k8s launcher: starting a pod of {pod.image} in namespace {namespace} on {endpoint} "
        f"(label {LAUNCH_LABEL}={launch_id})"
    )
    record_worker(
        context,
        K8sLauncher.name,
        namespace=namespace,
        launch_id=launch_id,
        grace_s=termination_grace_s,
        cluster=pod.model_dump(include={"kubeconfig_file", "kube_context", "load_incluster_config"}),
    )
    # After run() returns or raises, the client's global config is loaded: the pod is found and deleted here,
    # not by run(), so that its exit code can be read first and a cancelled trainer gets its grace period.
    core = None
    try:
        try:
            client.run(
                context=context,
                image=pod.image,
                command=list(command),
                namespace=namespace,
                env=public_env(env, context.log.warning),
                base_pod_meta=pod_meta(pod, launch_id),
                base_pod_spec=spec,
                pod_wait_timeout=float(pod.pod_wait_timeout_s),
                delete_pod_on_completion=False,
            )
            return 0
        except DagsterK8sError as exc:
            core = DagsterKubernetesClient.production_client().core_api
            code, why = _termination(core, namespace, launch_id)
            if code in (EXIT_FAILED, EXIT_CANCELLED):  # the worker's own ending: its outcome says why...
                # ...unless it ended before dagster-k8s began to stream the log (it waits for the pod to be
                # ready first): then the log tail in dagster-k8s's error is all there is
                context.log.warning(f"k8s launcher: the worker pod ended ({why}): {_first_lines(str(exc))}")
                return code
            raise Failure(
                description=f"k8s launcher: the worker pod in namespace {namespace} failed"
                f"{f' ({why})' if why else ''}: {_first_lines(str(exc))}"
            ) from exc
        except kubernetes.client.ApiException as exc:  # refused: forbidden, invalid spec, over quota
            raise Failure(
                description=f"k8s launcher: the API server at {endpoint} refused the worker pod in "
                f"namespace {namespace}: {exc.status} {exc.reason}: "
                f"{_first_lines(str(exc.body or ''))}"
            ) from exc
    finally:
        _delete_pods(
            core or DagsterKubernetesClient.production_client().core_api,
            namespace,
            launch_id,
            termination_grace_s,
            context.log,
        )


def _termination(core, namespace: str, launch_id: str) -> tuple[int | None, str]:
    """(exit code of the worker container or None, why the pod ended) of the pod with this launch id."""
    try:
        pods = core.list_namespaced_pod(namespace, label_selector=f"{LAUNCH_LABEL}={launch_id}").items
    except Exception as exc:  # noqa: BLE001 - the failure itself is reported by the caller
        return None, f"pod status unavailable: {exc}"
    if not pods:
        return None, "the pod is gone"
    status = pods[0].status
    reasons = [f"pod {pods[0].metadata.name}"]
    if status.reason:  # Evicted, DeadlineExceeded, ...
        reasons.append(f"{status.reason}: {status.message or ''}".rstrip(": "))
    for cs in status.container_statuses or []:
        if cs.name != WORKER_CONTAINER:
            continue
        if cs.state and cs.state.terminated:
            t = cs.state.terminated
            reasons.append(
                f"exit code {t.exit_code}, {t.reason or 'terminated'}" + (f": {t.message}" if t.message else "")
            )
            return t.exit_code, "; ".join(reasons)
        if cs.state and cs.state.waiting:
            reasons.append(f"{cs.state.waiting.reason}: {cs.state.waiting.message or ''}".rstrip(": "))
    return None, "; ".join(reasons)


def _delete_pods(core, namespace: str, launch_id: str, grace_s: float, log) -> None:
    """Delete this launch's pod: SIGTERM to the worker, SIGKILL after grace_s (the kubelet's side of it)."""
    try:
        pods = core.list_namespaced_pod(namespace, label_selector=f"{LAUNCH_LABEL}={launch_id}").items
        for item in pods:
            running = not (item.status and item.status.phase in ("Succeeded", "Failed"))
            if running:
                log.info(
                    f"k8s launcher: stopping pod {item.metadata.name}: SIGTERM, then SIGKILL after {grace_s:.0f} s"
                )
            core.delete_namespaced_pod(item.metadata.name, namespace, grace_period_seconds=int(math.ceil(grace_s)))
    except Exception as exc:  # noqa: BLE001 - never hide the step's own outcome behind a cleanup error
        log.warning(
            f"k8s launcher: could not delete the pod labelled {LAUNCH_LABEL}={launch_id} in namespace "
            f"{namespace} ({type(exc).__name__}: {exc}); delete it by hand"
        )


class _Said:
    """A log that keeps what it is told (the run launcher reports it as one engine event)."""

    def __init__(self, messages: list[str]):
        self.messages = messages

    def info(self, message: str) -> None:
        self.messages.append(message)

    warning = info


def _first_lines(text: str, n: int = 40) -> str:
    lines = text.splitlines()
    return "\n".join(lines[:n] + ([f"... ({len(lines) - n} more lines)"] if len(lines) > n else []))


def _core_api(where: dict):
    """A CoreV1Api for the cluster a record_worker description names (its kubeconfig, context or service account)."""
    import kubernetes

    cfg, _ = _client_configuration(K8sPod(**where.get("cluster", {})))
    cfg.retries = 0
    return kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(cfg))


class K8sLauncher:
    """The worker as a pod (its resources, volumes and secrets from the resource's `k8s` settings)."""

    name: ClassVar[str] = "k8s"

    @staticmethod
    def worker_state(where: dict) -> WorkerState:
        try:
            pods = (
                _core_api(where)
                .list_namespaced_pod(where["namespace"], label_selector=f"{LAUNCH_LABEL}={where['launch_id']}")
                .items
            )
        except Exception:  # noqa: BLE001 - no configuration here, or the API server does not answer: cannot tell
            return "unknown"
        ended = ("Succeeded", "Failed")
        return "running" if any(p.status and p.status.phase not in ended for p in pods) else "gone"

    @staticmethod
    def stop_worker(where: dict) -> str:
        messages: list[str] = []
        grace_s = where.get("grace_s", 600)
        _delete_pods(_core_api(where), where["namespace"], where["launch_id"], grace_s, _Said(messages))
        return "; ".join(messages) or f"deleted the pod labelled {LAUNCH_LABEL}={where['launch_id']}"

    def launch(self, context, resource, command: list[str], env: dict[str, str], tap, parallel: bool) -> int:
        n = resource.workers if parallel else 1  # torchrun runs the ranks inside the one pod
        return run_pod(
            context,
            resource.k8s,
            command,
            env,
            tap.wrap,
            cpus=resource.cpus_per_worker * n,
            gpus=resource.gpus() * n,
            memory_gb=resource.memory_gb_per_worker * n,
            termination_grace_s=resource.termination_timeout_s,
        )
