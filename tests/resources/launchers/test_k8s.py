"""The k8s launcher without a cluster: the pod manifest it renders (checked against the Kubernetes client's
models), a run through dagster-k8s's Pipes client against a fake API server that runs the container's
command here (so the worker's Pipes messages really travel through the pod log reader and the PipesTap),
and a dead endpoint that fails fast with its address in the error."""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import textwrap
import time
import types
from datetime import UTC, datetime, timedelta

import pytest

pytest.importorskip("dagster_k8s")
pytestmark = pytest.mark.timeout(60)  # a wait loop gone wrong fails here, not after the suite's 15 minutes

import kubernetes  # noqa: E402
from dagster import ConfigurableResource, DagsterInstance, Failure, Output, asset, materialize  # noqa: E402
from dagster._core.errors import DagsterExecutionInterruptedError  # noqa: E402
from dagster_k8s.client import DagsterKubernetesClient  # noqa: E402
from dagster_k8s.models import k8s_model_from_dict, k8s_snake_case_dict  # noqa: E402
from dagster_pipes import DAGSTER_PIPES_CONTEXT_ENV_VAR, DAGSTER_PIPES_MESSAGES_ENV_VAR, decode_env_var  # noqa: E402

from dragon_dagster.engine.runtime.execution import EXIT_FAILED  # noqa: E402
from dragon_dagster.engine.runtime.worker import PARENT_PID  # noqa: E402
from dragon_dagster.resources.launchers import PipesTap, k8s, k8s_pod  # noqa: E402
from dragon_dagster.resources.launchers.base import recorded_workers  # noqa: E402
from dragon_dagster.resources.launchers.k8s import K8sLauncher, check_cluster, run_pod  # noqa: E402
from dragon_dagster.resources.launchers.k8s_pod import K8sPod, render_pod  # noqa: E402
from tests.support import closed_port  # noqa: E402

WORKER = ["python", "-m", "dragon_dagster.engine.runtime.worker", "/runs/artifacts/p/sft/.job-run.json"]
SECRET = "s3cr3t-value-never-in-a-manifest"


def gpu_pod(**overrides) -> K8sPod:
    return K8sPod(
        **{
            "image": "registry.example/dragon-dagster:1.0",
            "namespace": "ml",
            "service_account_name": "trainer",
            "node_selector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "volumes": [{"name": "runs", "persistentVolumeClaim": {"claimName": "dragon-runs"}}],
            "volume_mounts": [{"name": "runs", "mountPath": "/runs"}],
            "env_from_secrets": ["mlflow-credentials", "s3-credentials"],
            "pod_labels": {"team": "post-training"},
            **overrides,
        }
    )


def as_v1pod(manifest: dict) -> kubernetes.client.V1Pod:
    """The manifest through the Kubernetes client's models: unknown or misspelt fields raise."""
    return k8s_model_from_dict(kubernetes.client.V1Pod, k8s_snake_case_dict(kubernetes.client.V1Pod, manifest))


def container_env(manifest: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in manifest["spec"]["containers"][0]["env"]}


def test_rendered_pod_is_a_valid_v1_pod_with_everything_the_worker_needs(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)  # in the parent's environment: must not leak
    manifest = render_pod(
        gpu_pod(),
        WORKER,
        {"MLFLOW_TRACKING_URI": "http://mlflow.ml:5000"},
        cpus=8.0,
        gpus=2,
        memory_gb=64,
        termination_grace_s=900,
    )
    v1 = as_v1pod(manifest)
    assert v1.kind == "Pod" and v1.metadata.namespace == "ml"
    assert v1.metadata.labels["team"] == "post-training"
    spec = manifest["spec"]
    (container,) = spec["containers"]
    assert container["image"] == "registry.example/dragon-dagster:1.0"
    assert container["command"] == WORKER
    assert container["resources"] == {
        "requests": {"cpu": "8", "memory": "64Gi"},
        "limits": {"memory": "64Gi", "nvidia.com/gpu": "2"},
    }
    assert spec["volumes"] == [{"name": "runs", "persistentVolumeClaim": {"claimName": "dragon-runs"}}]
    assert container["volumeMounts"] == [{"name": "runs", "mountPath": "/runs"}]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert spec["serviceAccountName"] == "trainer"
    assert container["envFrom"] == [
        {"secretRef": {"name": "mlflow-credentials"}},
        {"secretRef": {"name": "s3-credentials"}},
    ]
    assert spec["restartPolicy"] == "Never"
    assert spec["terminationGracePeriodSeconds"] == 900
    assert spec["activeDeadlineSeconds"] == 7 * 86400  # the kubelet ends a pod that hangs: nothing else would
    env = container_env(manifest)
    assert env["MLFLOW_TRACKING_URI"] == "http://mlflow.ml:5000"
    assert DAGSTER_PIPES_CONTEXT_ENV_VAR in env
    # the worker writes its messages to stderr, where the pod log reader looks for them
    assert decode_env_var(env[DAGSTER_PIPES_MESSAGES_ENV_VAR]) == {"stdio": "stderr"}
    assert SECRET not in json.dumps(manifest)


def test_cpu_only_pod_requests_no_gpu_and_custom_gpu_resources():
    manifest = render_pod(gpu_pod(), WORKER, cpus=0.5, gpus=0, memory_gb=1.5)
    as_v1pod(manifest)
    resources = manifest["spec"]["containers"][0]["resources"]
    assert resources == {"requests": {"cpu": "500m", "memory": "1536Mi"}, "limits": {"memory": "1536Mi"}}
    assert "gpu" not in json.dumps(resources)
    amd = render_pod(gpu_pod(gpu_resource="amd.com/gpu"), WORKER, cpus=1, gpus=1, memory_gb=8)
    assert amd["spec"]["containers"][0]["resources"]["limits"]["amd.com/gpu"] == "1"
    shm = render_pod(gpu_pod(shm_size_gb=8), WORKER, cpus=1, gpus=2, memory_gb=64)
    as_v1pod(shm)
    assert shm["spec"]["volumes"][-1] == {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "8192Mi"}}
    assert shm["spec"]["containers"][0]["volumeMounts"][-1] == {"name": "dshm", "mountPath": "/dev/shm"}
    with pytest.raises(ValueError, match="whole devices"):
        render_pod(gpu_pod(), WORKER, cpus=1, gpus=0.5, memory_gb=1)


def test_credentials_in_the_job_env_stay_out_of_the_manifest():
    warnings: list[str] = []
    manifest = render_pod(
        gpu_pod(),
        WORKER,
        {
            "AWS_SECRET_ACCESS_KEY": SECRET,
            "MLFLOW_TRACKING_TOKEN": SECRET,
            "HF_TOKEN": SECRET,
            "MLFLOW_TRACKING_URI": f"https://user:{SECRET}@mlflow.example",
            PARENT_PID: "4242",
            "MLFLOW_ALLOW_FILE_STORE": "true",
        },
        cpus=1,
        gpus=1,
        memory_gb=8,
        warn=warnings.append,
    )
    text = json.dumps(manifest)
    assert SECRET not in text
    env = container_env(manifest)
    assert env["MLFLOW_ALLOW_FILE_STORE"] == "true"
    assert PARENT_PID not in env  # the worker's watchdog would see a parent it never had
    assert len(warnings) == 4 and all("env_from_secrets" in w and SECRET not in w for w in warnings)


def test_a_misspelt_volume_spec_is_refused_by_the_kubernetes_models():
    bad = gpu_pod(volumes=[{"name": "runs", "persistentVolumeClam": {"claimName": "dragon-runs"}}])
    with pytest.raises(Exception, match="persistentVolumeClam|persistent_volume_clam"):
        render_pod(bad, WORKER, cpus=1, gpus=0, memory_gb=1)


class R(ConfigurableResource):  # at module level: Dagster resolves the asset's annotation by name
    k8s: K8sPod = K8sPod()


def test_k8s_pod_nests_in_a_configurable_resource():
    assert R().k8s.image == "" and R().k8s.gpu_resource == "nvidia.com/gpu"
    pod = gpu_pod(image="x")
    assert R(k8s=pod).k8s == pod
    seen = []

    @asset
    def uses(r: R):
        seen.append(r.k8s)

    config = {
        "image": "y",
        "volumes": [{"name": "runs", "persistentVolumeClaim": {"claimName": "c"}}],
        "node_selector": {"pool": "gpu"},
        "env_from_secrets": ["s3-credentials"],
    }
    assert materialize(
        [uses], resources={"r": R()}, run_config={"resources": {"r": {"config": {"k8s": config}}}}
    ).success
    assert seen[0] == K8sPod(**config)


# --- a run through PipesK8sClient, against a fake API server ------------------------------------------------

POD_SCRIPT = textwrap.dedent("""
    import sys
    from dagster_pipes import open_dagster_pipes
    with open_dagster_pipes() as pipes:
        pipes.log.info("worker in a pod")
        pipes.report_custom_message({"kind": "metrics", "step": 1, "values": {"loss": 0.5}})
        code = int(sys.argv[1])
        if code == 0:
            pipes.report_custom_message({"kind": "outcome", "event": "result", "result": {"ok": True}})
        elif code == 2:
            pipes.report_custom_message({"kind": "outcome", "event": "error", "error": "ValueError: bad"})
    sys.exit(code)
""")


class FakeCoreApi:
    """Just enough of CoreV1Api for PipesK8sClient.run: creating the pod runs its container's command here,
    with the manifest's environment; the pod reads as running until its log has been streamed, then as
    terminated with the command's exit code (reason given by `reason`, e.g. OOMKilled)."""

    def __init__(self, reason: str | None = None, interrupt: bool = False):
        self.reason, self.interrupt = reason, interrupt
        self.created: list[tuple[str, dict]] = []
        self.deleted: list[tuple[str, str, int | None]] = []
        self.log_lines: list[str] = []
        self.exit_code = None
        self.streamed = False

    def create_namespaced_pod(self, namespace, body):
        manifest = kubernetes.client.ApiClient().sanitize_for_serialization(body)
        self.created.append((namespace, manifest))
        proc = subprocess.run(
            manifest["spec"]["containers"][0]["command"],
            capture_output=True,
            text=True,
            timeout=60,
            env={"PATH": "/usr/bin:/bin", **container_env(manifest)},
        )
        start = datetime(2026, 1, 1, tzinfo=UTC)
        lines = (proc.stdout + proc.stderr).splitlines()
        self.log_lines = [
            f"{(start + timedelta(milliseconds=i)).strftime('%Y-%m-%dT%H:%M:%S.%fZ')} {line}\n"
            for i, line in enumerate(lines)
        ]
        self.exit_code = proc.returncode
        self.name, self.labels = manifest["metadata"]["name"], manifest["metadata"]["labels"]

    def _pod(self):
        c = kubernetes.client
        self.polls = getattr(self, "polls", 0) + 1
        assert self.streamed or self.polls < 100, "the pod log was never streamed"  # no sleeps: fail, not spin
        if self.streamed:
            state = c.V1ContainerState(
                terminated=c.V1ContainerStateTerminated(
                    exit_code=self.exit_code, reason=self.reason or ("Completed" if self.exit_code == 0 else "Error")
                )
            )
            phase = "Succeeded" if self.exit_code == 0 else "Failed"
        else:
            state, phase = c.V1ContainerState(running=c.V1ContainerStateRunning()), "Running"
        status = c.V1ContainerStatus(
            name="worker", ready=not self.streamed, restart_count=0, image="x", image_id="", state=state
        )
        return c.V1Pod(
            metadata=c.V1ObjectMeta(name=self.name, labels=self.labels),
            status=c.V1PodStatus(phase=phase, container_statuses=[status]),
        )

    def list_namespaced_pod(self, namespace, field_selector=None, label_selector=None, **_):
        pods = [self._pod()] if self.created else []
        if label_selector:
            key, _, value = label_selector.partition("=")
            pods = [p for p in pods if p.metadata.labels.get(key) == value]
        return kubernetes.client.V1PodList(items=pods)

    def read_namespaced_pod_log(self, name, namespace, follow=False, **_):
        if follow and self.interrupt:  # the run is terminated while the worker trains
            raise DagsterExecutionInterruptedError()
        if follow:  # the Pipes reader: an iterable of byte chunks
            self.streamed = True
            return [line.encode() for line in self.log_lines]
        return types.SimpleNamespace(data="".join(self.log_lines[-5:]).encode())

    def delete_namespaced_pod(self, name, namespace, grace_period_seconds=None, **_):
        self.deleted.append((name, namespace, grace_period_seconds))


@pytest.fixture
def fake_cluster(monkeypatch, tmp_path):
    """A FakeCoreApi behind dagster-k8s's client; the reachability check answered without a network."""
    holder = {}

    def production_client(*_args, **_kwargs):
        return DagsterKubernetesClient(
            batch_api=None, core_api=holder["api"], logger=lambda _m: None, sleeper=lambda _s: None, timer=time.time
        )

    monkeypatch.setattr(DagsterKubernetesClient, "production_client", staticmethod(production_client))
    monkeypatch.setattr(k8s, "check_cluster", lambda pod: "https://fake-apiserver:6443")
    script = tmp_path / "pod_script.py"
    script.write_text(POD_SCRIPT)
    kubeconfig = write_kubeconfig(tmp_path, "https://fake-apiserver:6443")

    def start(reason=None, interrupt=False):
        holder["api"] = FakeCoreApi(reason, interrupt)
        return holder["api"], script, kubeconfig

    return start


def run_in_fake_pod(api, script, kubeconfig, exit_code: int):
    got: dict = {"metrics": []}

    @asset
    def trained(context):
        tap = PipesTap(on_metrics=lambda step, values: got["metrics"].append((step, values)))
        got["code"] = run_pod(
            context,
            gpu_pod(kubeconfig_file=str(kubeconfig), poll_interval_s=0.01),
            [sys.executable, str(script), str(exit_code)],
            {"MLFLOW_TRACKING_URI": "http://mlflow.ml:5000", "AWS_SECRET_ACCESS_KEY": SECRET, PARENT_PID: "1"},
            tap.wrap,
            cpus=1,
            gpus=1,
            memory_gb=2,
            termination_grace_s=77,
        )
        got["outcome"] = tap.outcome
        return Output(got["code"])  # as the stages do: with a Pipes session, Dagster wants an explicit output

    instance = DagsterInstance.ephemeral()
    result = materialize([trained], raise_on_error=False, instance=instance)
    got["tags"] = instance.get_run_by_id(result.run_id).tags
    return result, got


def test_run_pod_streams_the_workers_messages_through_the_tap(fake_cluster):
    api, script, kubeconfig = fake_cluster()
    result, got = run_in_fake_pod(api, script, kubeconfig, 0)
    assert result.success
    assert got["code"] == 0
    assert got["metrics"] == [(1, {"loss": 0.5})]
    assert got["outcome"] == {"event": "result", "result": {"ok": True}}
    ((namespace, manifest),) = api.created
    assert namespace == "ml"
    as_v1pod(manifest)
    # what was submitted is what render_pod shows, but for the run's own context and name
    rendered = render_pod(
        gpu_pod(),
        manifest["spec"]["containers"][0]["command"],
        {"MLFLOW_TRACKING_URI": "http://mlflow.ml:5000"},
        cpus=1,
        gpus=1,
        memory_gb=2,
        termination_grace_s=77,
    )
    for key in (
        "volumes",
        "nodeSelector",
        "tolerations",
        "restartPolicy",
        "terminationGracePeriodSeconds",
        "serviceAccountName",
    ):
        assert manifest["spec"][key] == rendered["spec"][key]
    submitted, shown = manifest["spec"]["containers"][0], rendered["spec"]["containers"][0]
    assert {k: v for k, v in submitted.items() if k != "env"} == {k: v for k, v in shown.items() if k != "env"}
    assert set(container_env(manifest)) == set(container_env(rendered))
    assert SECRET not in json.dumps(manifest)
    assert manifest["metadata"]["labels"][k8s_pod.LAUNCH_LABEL]
    assert api.deleted == [(manifest["metadata"]["name"], "ml", 77)]  # the trainer's grace period
    # the run says where its worker ran, for the run launcher's health check
    where = recorded_workers(got["tags"])["trained"]
    assert where["launcher"] == "k8s" and where["namespace"] == "ml" and where["grace_s"] == 77
    assert where["launch_id"] == manifest["metadata"]["labels"][k8s_pod.LAUNCH_LABEL]
    assert where["cluster"]["kubeconfig_file"] == str(kubeconfig)


def test_the_run_launcher_sees_and_deletes_a_pod_whose_run_is_gone(fake_cluster, monkeypatch, tmp_path):
    api, _, _ = fake_cluster()
    api.created, api.name, api.labels = [("ml", {})], "dragon-worker-1", {k8s_pod.LAUNCH_LABEL: "abc"}
    monkeypatch.setattr(k8s, "_core_api", lambda where: api)
    where = {"launcher": "k8s", "namespace": "ml", "launch_id": "abc", "grace_s": 77, "cluster": {}}
    assert K8sLauncher.worker_state(where) == "running"
    assert K8sLauncher.worker_state({**where, "launch_id": "other"}) == "gone"  # no pod with that label
    assert "stopping pod dragon-worker-1" in K8sLauncher.stop_worker(where)
    assert api.deleted == [("dragon-worker-1", "ml", 77)]  # with the trainer's grace period
    api.streamed, api.exit_code = True, 143
    assert K8sLauncher.worker_state(where) == "gone"
    monkeypatch.undo()
    unreachable = {"kubeconfig_file": str(write_kubeconfig(tmp_path, f"https://127.0.0.1:{closed_port()}"))}
    assert K8sLauncher.worker_state({**where, "cluster": unreachable}) == "unknown"


def test_run_pod_returns_the_workers_own_failure_code(fake_cluster):
    api, script, kubeconfig = fake_cluster()
    result, got = run_in_fake_pod(api, script, kubeconfig, EXIT_FAILED)
    assert result.success  # run_pod returned; the training resource turns the code into its Failure
    assert got["code"] == EXIT_FAILED
    assert got["outcome"] == {"event": "error", "error": "ValueError: bad"}
    assert len(api.deleted) == 1


def test_a_killed_pod_fails_the_step_with_the_pods_reason(fake_cluster):
    api, script, kubeconfig = fake_cluster(reason="OOMKilled")
    result, got = run_in_fake_pod(api, script, kubeconfig, 137)
    assert not result.success and "code" not in got
    (failure,) = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    message = str(failure.step_failure_data.error.message)
    assert "OOMKilled" in message and "exit code 137" in message and api.name in message
    assert len(api.deleted) == 1


def test_a_terminated_run_deletes_the_pod_with_the_trainers_grace_period(fake_cluster):
    api, script, kubeconfig = fake_cluster(interrupt=True)
    result, got = run_in_fake_pod(api, script, kubeconfig, 0)
    assert not result.success and "code" not in got
    assert api.deleted == [(api.name, "ml", 77)]  # the kubelet: SIGTERM, SIGKILL 77 s later


# --- no cluster at all ----------------------------------------------------------------------------------------


def write_kubeconfig(tmp_path, server: str):
    path = tmp_path / "kubeconfig"
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "test",
                "clusters": [{"name": "test", "cluster": {"server": server, "insecure-skip-tls-verify": True}}],
                "users": [{"name": "test", "user": {"token": "not-a-real-token"}}],
                "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test", "namespace": "ml"}}],
            }
        )
    )
    return path


def test_run_pod_fails_fast_naming_a_refused_endpoint(tmp_path):
    port = closed_port()
    pod = K8sPod(image="x", kubeconfig_file=str(write_kubeconfig(tmp_path, f"https://127.0.0.1:{port}")))
    context = types.SimpleNamespace(log=logging.getLogger("test"), run_id="r")
    start = time.monotonic()
    with pytest.raises(Failure) as raised:
        run_pod(context, pod, WORKER, {}, lambda r: r, cpus=1, gpus=0, memory_gb=1, termination_grace_s=1)
    assert time.monotonic() - start < 5
    assert f"https://127.0.0.1:{port}" in raised.value.description
    assert "cannot reach the Kubernetes API server" in raised.value.description
    assert "kubeconfig" in raised.value.description


def test_a_silent_endpoint_times_out_instead_of_hanging(tmp_path):
    with socket.socket() as server:  # accepts the connection (kernel backlog) and never says a word
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        pod = K8sPod(
            image="x", connect_timeout_s=1, kubeconfig_file=str(write_kubeconfig(tmp_path, f"https://127.0.0.1:{port}"))
        )
        start = time.monotonic()
        with pytest.raises(Failure, match=f"127.0.0.1:{port}.*within 1 s"):
            check_cluster(pod)
        assert time.monotonic() - start < 5


def test_no_image_and_no_kubeconfig_are_clear_errors(tmp_path):
    context = types.SimpleNamespace(log=logging.getLogger("test"))
    with pytest.raises(Failure, match="k8s.image is not set"):
        run_pod(context, K8sPod(), WORKER, {}, cpus=1, gpus=0, memory_gb=1)
    with pytest.raises(Failure, match="no usable Kubernetes configuration"):
        check_cluster(K8sPod(image="x", kubeconfig_file=str(tmp_path / "missing")))


def test_dragon_k8s_pod_prints_the_manifest_a_run_would_submit(tmp_path):
    import yaml
    from click.testing import CliRunner

    from dragon_dagster.cli import main

    config = tmp_path / "k8s.yaml"
    config.write_text("image: registry.example/dragon:1\nnamespace: ml\nshm_size_gb: 1\n")
    result = CliRunner().invoke(main, ["k8s-pod", str(config), "--cpus", "2", "--memory-gb", "8", "--gpus", "0"])
    assert result.exit_code == 0, result.output
    manifest = yaml.safe_load(result.output)
    [container] = manifest["spec"]["containers"]
    assert (manifest["metadata"]["namespace"], container["image"]) == ("ml", "registry.example/dragon:1")
    assert container["resources"] == {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"memory": "8Gi"}}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]

    config.write_text("namespace: ml\n")
    refused = CliRunner().invoke(main, ["k8s-pod", str(config)])
    assert refused.exit_code != 0 and "has no image: set `image:" in refused.output, refused.output
