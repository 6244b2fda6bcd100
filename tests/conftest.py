"""Shared fixtures: a tiny random model built from the embedded tokenizer, a pipeline YAML on it, and one
materialized chain that several tests read (real Dagster instance, real MLflow sqlite store)."""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from tests import support
from tests.support import (
    BUMP_TOOLS,
    StubServer,
    apt_install,
    closed_port,
    forget_modules,
    free_port,
    healthy,
    new_bucket,
    s3_env,
    wait_until,
    write_pipeline,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here reaches the hub; fail fast instead of retrying
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One torch thread per process: the tests' models are tiny, so a second thread mostly waits on the first, and
# the test process and a worker share the machine (measured on 2 cores: 81 s -> 58 s for the training-kind tests).
# Workers inherit it; set OMP_NUM_THREADS to override.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# The suites' warm worker (engine/runtime/warm/) apart from a developer's own (`make ui`, `dragon demo`), whose
# environment differs: every test process and the servers they start share this one.
os.environ.setdefault("DRAGON_WARM_DIR", f"/tmp/dragon-warm-{os.getuid()}-tests")


GUARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGALRM)
# A suite started in the background of a non-interactive shell (`make test &`, nohup) inherits SIGINT ignored. Tests
# that interrupt themselves need Python's own handler, and Dagster's in-process runs map SIGTERM to SIGINT's handler,
# so every child a test starts after one would ignore SIGTERM too: the suite runs as from a terminal, whoever starts it.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
if signal.getsignal(signal.SIGTERM) == signal.SIG_IGN:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
SIGNALS_AS_STARTED = {number: signal.getsignal(number) for number in GUARDED_SIGNALS}


@pytest.fixture(autouse=True)
def process_state_as_found(tmp_path_factory):
    """Each test leaves the process as it found it, so the order never matters: Dagster's in-process execution
    installs its own interrupt handlers (capture_interrupts) and can leave SIGTERM remapped; a library may set an
    environment variable that a later job's warm start compares (Gradio's telemetry switch); a test's Dagster
    project, written under the session's temp folder and imported, stays in sys.modules under a name the next
    test reuses. Only modules from that folder go: the checkout and its .venv may themselves lie under /tmp."""
    handlers = {number: signal.getsignal(number) for number in GUARDED_SIGNALS}
    for number in (signal.SIGINT, signal.SIGTERM):  # as the suite started, whatever a session fixture's run left
        if handlers[number] is not SIGNALS_AS_STARTED[number]:
            handlers[number] = SIGNALS_AS_STARTED[number]
            signal.signal(number, handlers[number])
    path, modules, environment = list(sys.path), set(sys.modules), dict(os.environ)
    temp = tmp_path_factory.getbasetemp()
    temp = str(temp.parent if os.environ.get("PYTEST_XDIST_WORKER") else temp)
    yield
    for number, handler in handlers.items():
        if signal.getsignal(number) is not handler and handler is not None:
            signal.signal(number, handler)
    sys.path[:] = path
    if os.environ != environment:  # Gradio's Blocks sets HF_HUB_DISABLE_TELEMETRY: later jobs would then start cold
        os.environ.clear()
        os.environ.update(environment)
    forget_modules(sorted(set(sys.modules) - modules), temp)


@contextmanager
def built_once(tmp_path_factory, name: str):
    """A folder that one pytest-xdist worker builds and the others wait for and share read-only (the temp root
    above each worker's own); yields (folder, whether this caller builds it). A failed build leaves no marker."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    folder, done = root / name, root / f"{name}.built"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists():
            yield folder, False
            return
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        yield folder, True
        done.touch()


# ------------------------------------------------------------------------ MLflow's empty sqlite store, made once


def mlflow_empty_store(tmp_path_factory, initialize_tables) -> Path:
    """An MLflow sqlite store with every table created and migrated by this MLflow (its _initialize_tables, nothing
    else: no default experiment, which a store adds on open with its own artifact root), made once for every test
    process (built_once). Creating the tables runs MLflow's migrations one commit at a time: 3-5 s of CPU and
    10-15 s on a busy 2-core machine, for each new runs directory; a copy takes 0.05 s."""
    with built_once(tmp_path_factory, "mlflow_empty_store") as (folder, build):
        if build:
            import sqlalchemy

            engine = sqlalchemy.create_engine(f"sqlite:///{folder / 'mlflow.db'}")
            try:
                initialize_tables(engine)
            finally:
                engine.dispose()
    return folder / "mlflow.db"


@pytest.fixture(scope="session", autouse=True)
def mlflow_tables_copied(tmp_path_factory):
    """Every MLflow sqlite store this process creates gets its tables as a copy of one store migrated once by
    the same MLflow (mlflow_empty_store), not by running the migrations again: tests create a new runs directory,
    hence a new store, by the hundred. MLflow calls _initialize_tables only for a database that lacks its tables
    (under its own file lock where stores race); the copy leaves the schema at MLflow's head revision, which the
    store then verifies as it always does. PostgreSQL stores migrate as before; a test that starts processes on
    a runs directory of its own seeds that store first (tests/support.py seed_mlflow_store)."""
    import sqlite3

    import mlflow.store.db.utils as db_utils
    import mlflow.store.model_registry.sqlalchemy_store as registry_store

    original = db_utils._initialize_tables
    support.EMPTY_MLFLOW_STORE[:] = [lambda: mlflow_empty_store(tmp_path_factory, original)]

    def initialize_tables(engine):
        database = engine.url.database
        if engine.url.get_backend_name() != "sqlite" or not database or database == ":memory:":
            return original(engine)
        with engine.connect() as connection:  # the store's own connection (its pool keeps it), copied into
            source = sqlite3.connect(mlflow_empty_store(tmp_path_factory, original))
            try:
                source.backup(connection.connection.driver_connection)
            finally:
                source.close()

    db_utils._initialize_tables = initialize_tables
    registry_store._initialize_tables = initialize_tables
    yield
    db_utils._initialize_tables = original
    registry_store._initialize_tables = original
    support.EMPTY_MLFLOW_STORE.clear()


@pytest.fixture(scope="session")
def embedded_dir() -> Path:
    from dragon_dagster.engine import models

    return models.embedded_model_dir()


@pytest.fixture(scope="session")
def tiny_model(embedded_dir, tmp_path_factory) -> Path:
    from dragon_dagster.engine import models

    return models.build_tiny_model(tmp_path_factory.mktemp("models") / "tiny", tokenizer_from=str(embedded_dir))


@pytest.fixture()
def resources_for():
    from dragon_dagster.resources import ArtifactStore, MLflowTracking, TrainingResource

    def make(runs_dir: Path) -> dict:
        return {
            "store": ArtifactStore(runs_dir=str(runs_dir)),
            "tracking": MLflowTracking(runs_dir=str(runs_dir)),
            "training": TrainingResource(device="cpu"),
        }

    return make


@pytest.fixture(scope="session")
def materialized(tiny_model, tmp_path_factory):
    """The whole tiny chain, materialized once on a persistent temp Dagster instance."""
    from dagster import DagsterInstance

    from dragon_dagster.assets.launch import materialize_pipeline
    from dragon_dagster.engine.pipeline import load
    from dragon_dagster.resources import ArtifactStore, MLflowTracking, TrainingResource

    root = tmp_path_factory.mktemp("chain")
    pipeline = load(write_pipeline(root / "defs", tiny_model))
    runs = root / "runs"
    resources = {
        "store": ArtifactStore(runs_dir=str(runs)),
        "tracking": MLflowTracking(runs_dir=str(runs)),
        "training": TrainingResource(device="cpu"),
    }
    (root / "dagster_home").mkdir()
    instance = DagsterInstance.local_temp(str(root / "dagster_home"))
    outcome = materialize_pipeline(pipeline, resources=resources, instance=instance)
    return {
        "outcome": outcome,
        "runs": runs,
        "instance": instance,
        "tracking": resources["tracking"],
        "pipeline": pipeline,
    }


@pytest.fixture()
def chain_copy(materialized, tmp_path):
    """The materialized chain for a test that writes to it (retrains, promotes, records feedback): its own copy of
    the MLflow store and the Dagster instance, so the shared chain stays as built whatever runs first. The
    chain's artifact directories (immutable, named by absolute paths in both stores) stay shared, read only."""
    from dagster import DagsterInstance

    from dragon_dagster.resources import MLflowTracking

    runs, home = tmp_path / "chain_runs", tmp_path / "chain_dagster_home"
    shutil.copytree(materialized["runs"], runs, ignore=shutil.ignore_patterns("artifacts", "checkpoints"))
    shutil.copytree(materialized["instance"].root_directory, home)
    return {
        **materialized,
        "runs": runs,
        "instance": DagsterInstance.local_temp(str(home)),
        "tracking": MLflowTracking(runs_dir=str(runs)),
    }


@pytest.fixture(scope="session")
def tool_caller(tiny_model, tmp_path_factory) -> Path:
    """The tiny model taught (a full fine-tune, in this process) to answer "Check the counter" by calling bump,
    and to say "Done." after whatever the tool answers: a model that calls tools. Built once for all the test
    processes (about two minutes of a 2-core machine); its tools file stays beside it."""
    with built_once(tmp_path_factory, "tool_caller") as (root, build):
        if build:
            teach_the_bump_tool(tiny_model, root)
    return root / "tool_caller"


def teach_the_bump_tool(tiny_model: Path, root: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from dragon_dagster.engine import models
    from dragon_dagster.engine.infer.tool_loop import converse
    from dragon_dagster.engine.tools import template
    from dragon_dagster.engine.tools.declare import Tools, Toolset

    (root / "tools.py").write_text(BUMP_TOOLS.format(counter=str(root / "counter.txt")))
    toolset = Toolset.from_settings(Tools(file=str(root / "tools.py"), timeout=1))
    tokenizer = models.load_tokenizer(str(tiny_model))
    template.prepare(tokenizer)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    call = {"type": "function", "function": {"name": "bump", "arguments": {}}}
    texts = [
        tokenizer.apply_chat_template(
            [
                {"role": "user", "content": "Check the counter"},
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "name": "bump", "content": answer},
                {"role": "assistant", "content": "Done."},
            ],
            tools=toolset.schemas,
            tokenize=False,
        )
        for answer in ("count 1", "error: RuntimeError: the counter jammed", "error: timed out after 1s")
    ]
    # Only what follows the shared prompt (the tools' schemas and "Check the counter") is learned: the call, the
    # tool's answer and "Done.". The head runs on those positions alone, a tenth of the rows' tokens, so a step
    # costs a tenth of a full one's vocabulary projection (the tiny model's 49k-token head is nearly all its cost).
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Check the counter"}],
        tools=toolset.schemas,
        tokenize=False,
        add_generation_prompt=True,
    )
    start = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    batch = tokenizer(texts, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False)
    assert (batch["input_ids"][:, :start] == batch["input_ids"][0, :start]).all()  # the prompt is one prefix
    targets = batch["input_ids"][:, start:].masked_fill(batch["attention_mask"][:, start:] == 0, -100)
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-2)
    # Trained until it has learned, not for a fixed count: when it first answers right depends on the CPU's kernels
    # (about 120 steps on one machine, 240 on another). Learned: the loss under 0.05 and the whole exchange right
    # at two looks in a row, 20 steps apart, so a model that only just answers right (which a test's other code
    # path, batched or served, could tip over) is trained on.
    steady, turns = 0, []
    for step in range(1, 401):
        model.train()
        hidden = model.model(**batch).last_hidden_state[:, start - 1 : -1]
        logits = model.lm_head(hidden)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step % 20 == 0 and step >= 100:
            model.eval()
            [turns] = converse(model, tokenizer, [[{"role": "user", "content": "Check the counter"}]], toolset, 24)
            right = bool(turns[0].get("tool_calls")) and turns[-1]["content"] == "Done."
            steady = steady + 1 if right and loss.item() < 0.05 else 0
            if steady == 2:
                break
    assert steady == 2, turns  # it learned what it should
    model.eval()
    out = root / "tool_caller"
    model.save_pretrained(out)
    models.load_tokenizer(str(tiny_model)).save_pretrained(out)  # the model's own template: stages ready theirs


# ---------------------------------------------------------------- OpenAI-compatible servers on loopback


@pytest.fixture()
def stub():
    servers = []

    def start(respond) -> StubServer:
        servers.append(StubServer(respond))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


@pytest.fixture(scope="session")
def chatty_model(tiny_model, tmp_path_factory) -> Path:
    """The tiny model with an untied random output head, so greedy replies are visible text, not newlines."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from dragon_dagster.engine import models

    out = tmp_path_factory.mktemp("models") / "chatty"
    config = AutoConfig.from_pretrained(tiny_model)
    config.tie_word_embeddings = False
    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        model.lm_head.weight.normal_(0, 1.0)
    model.save_pretrained(out)
    models.load_tokenizer(str(tiny_model)).save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def served(chatty_model, tmp_path_factory):
    """`transformers serve` on a free loopback port with the chatty tiny model preloaded (offline)."""
    from transformers.utils.import_utils import is_serve_available

    if not is_serve_available():
        pytest.fail("transformers serve needs its serving extras: the dev extra installs openai (make test does)")
    exe = Path(sys.executable).with_name("transformers")
    exe = str(exe) if exe.exists() else shutil.which("transformers")
    port = closed_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    with log.open("w") as out:
        proc = subprocess.Popen(
            [exe, "serve", str(chatty_model), "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    import requests

    deadline = time.monotonic() + 120
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"transformers serve exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                if requests.get(f"http://127.0.0.1:{port}/health", timeout=1).ok:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"transformers serve did not come up:\n{log.read_text()[-3000:]}")
            time.sleep(0.25)
        yield {"url": f"http://127.0.0.1:{port}/v1", "model": str(chatty_model)}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# ------------------------------------------------------------------------------------- a Ray head on loopback


class RayHead:
    """`ray start --head` for the tests, on loopback only, on ports of its own (a developer's Ray keeps its
    defaults). stop() ends every process the head started, found by a variable they all inherit: Ray renames
    some of its processes and detaches them all, and `ray stop` would stop any other Ray on the machine."""

    def __init__(self, root: Path, cpus: int = 4):
        self.temp = Path(f"/tmp/ray-{os.getpid()}-{closed_port()}")  # short: Ray's unix sockets live under it
        self.marker = f"DRAGON_TEST_RAY_HEAD={self.temp.name}"
        self.dashboard_port, port = closed_port(), closed_port()
        self.address = f"http://127.0.0.1:{self.dashboard_port}"  # where jobs are submitted
        self.gcs_address = f"127.0.0.1:{port}"  # what a driver's ray.init joins (RAY_ADDRESS in a Ray job)
        env = {
            **os.environ,
            "DRAGON_TEST_RAY_HEAD": self.temp.name,
            "RAY_USAGE_STATS_ENABLED": "0",
            # Ray swaps 127.0.0.1 for the machine's address unless it is told it is not a cluster
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
            "RAY_AUTH_MODE": "disabled",  # a loopback test cluster needs no token (Ray would write one to ~/.ray)
            # a node of a cluster has the project in the `python` on its PATH: here, this interpreter's
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        }
        env.pop("RAY_ADDRESS", None)
        ports = {
            "--port": port,
            "--dashboard-port": self.dashboard_port,
            "--dashboard-agent-listen-port": closed_port(),
            "--ray-client-server-port": closed_port(),
        }
        ray = Path(sys.executable).with_name("ray")
        out = subprocess.run(
            [
                str(ray),
                "start",
                "--head",
                "--node-ip-address",
                "127.0.0.1",
                "--dashboard-host",
                "127.0.0.1",
                "--num-cpus",
                str(cpus),
                "--temp-dir",
                str(self.temp),
                "--disable-usage-stats",
                *(str(x) for kv in ports.items() for x in kv),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
            cwd=root,
        )
        if out.returncode != 0:
            self.stop()
            pytest.fail(f"ray start failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")

    def client(self):
        from ray.job_submission import JobSubmissionClient

        return JobSubmissionClient(self.address)

    def processes(self) -> list[int]:
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if self.marker.encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                    found.append(int(pid))
            except OSError:
                pass
        return found

    def train_processes(self) -> list[str]:
        """Ray Train's actors (ranks, controllers) still running on this head."""
        names = []
        for pid in self.processes():
            try:
                names.append(Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"))
            except OSError:
                continue
        return [n for n in names if "RayTrainWorker" in n or "TrainController" in n]

    def stop(self) -> None:
        for sig, wait_s in ((signal.SIGTERM, 5), (signal.SIGKILL, 1)):
            for pid in self.processes():
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait_s
            while self.processes() and time.monotonic() < deadline:
                time.sleep(0.2)
        shutil.rmtree(self.temp, ignore_errors=True)


@pytest.fixture(scope="session")
def ray_head(tmp_path_factory):
    """One Ray head for the session's tests (starting one takes about 10 s of a 2-core machine). 4 logical CPUs
    on 2 cores: two rank actors take one each, a job's driver and Ray Train's controller may want more."""
    head = RayHead(tmp_path_factory.mktemp("ray"))
    yield head
    head.stop()


# ------------------------------------------------------------------------------------------- browser

CHROMIUM = Path("/usr/bin/chromium")


@pytest.fixture(scope="session")
def chromium() -> Path:
    """Debian's Chromium (Playwright's own browser download cannot work here), installed when missing."""
    if not CHROMIUM.exists():
        problem = apt_install("chromium")
        if not CHROMIUM.exists():
            pytest.fail(f"cannot install chromium: {problem or 'installed, but no /usr/bin/chromium'}")
    return CHROMIUM


@contextmanager
def running_mlflow_server(
    root: Path, backend_store_uri: str, artifacts_destination: str | None, env: dict | None = None, port: int = 0
):
    """A real `mlflow server` on a loopback port (port, else a free one), serving (proxying) artifacts: yields its
    URL, killed after. env: added to this process's environment for the server (an object store's endpoint and
    keys; MLFLOW_ARTIFACTS_DESTINATION where artifacts_destination is None, as the deployment page's env file
    gives it). The backend store's URI goes in MLFLOW_BACKEND_STORE_URI, as a deployment passes it: a command line
    is visible to every user of the machine (ps), and a database URI holds a password."""
    port = port or free_port()
    log_path = root / "server.log"
    destination = ["--artifacts-destination", artifacts_destination] if artifacts_destination else []
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [
                str(Path(sys.executable).with_name("mlflow")),
                "server",
                *destination,
                "--serve-artifacts",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--workers",
                "1",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {}), "MLFLOW_BACKEND_STORE_URI": backend_store_uri},
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"

    def exited() -> str | None:
        code = process.poll()
        return None if code is None else f"exited with {code}:\n{log_path.read_text()[-3000:]}"

    try:  # about a minute on 2 idle cores (imports, then its tables created or migrated); more on a busy machine
        wait_until(lambda: healthy(f"{url}/health"), 180, "the mlflow server to answer", alive=exited, every=0.5)
        yield url
    finally:  # pytest.fail included: the server does not outlive a failed start
        os.killpg(process.pid, signal.SIGTERM)
        try:  # its job runner and consumers can take half a minute to stop on their own: a test server need not
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """A real `mlflow server` on loopback with its own sqlite store and proxied artifact store, shared by the
    tests that claim remote tracking (registry, tracing, assessments, prompts, evaluations)."""
    root = tmp_path_factory.mktemp("mlflow_server")
    with running_mlflow_server(
        root, f"sqlite:///{root / 'server.db'}", str(root / "artifacts"), support.MLFLOW_WITHOUT_JOBS
    ) as url:
        yield {"url": url, "root": root}


@pytest.fixture()
def start_mlflow_server(tmp_path_factory):
    """Starts a real `mlflow server` of the test's own: start(backend_store_uri, artifacts_destination, env, port)
    returns its URL; stopped when the test ends."""
    with ExitStack() as servers:

        def start(backend_store_uri: str, artifacts_destination: str | None, env: dict | None = None, port: int = 0):
            root = tmp_path_factory.mktemp("mlflow_server")
            return servers.enter_context(
                running_mlflow_server(root, backend_store_uri, artifacts_destination, env, port)
            )

        yield start


# ---------------------------------------------------------------------------- an S3-compatible server on loopback


@pytest.fixture(scope="session")
def moto_endpoint():
    """moto's S3 server (moto[server], `ThreadedMotoServer`: pure Python, from the package index with the dev
    extra; MinIO would need a binary download) on 127.0.0.1, shared by the session; any keys are accepted."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=closed_port(), verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture()
def bucket(moto_endpoint, monkeypatch) -> str:
    """A fresh bucket on the loopback server; the AWS_* environment s3fs and botocore read points at it."""
    for name, value in s3_env(moto_endpoint).items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    return new_bucket(moto_endpoint)


@pytest.fixture(scope="session")
def postgres():
    """A real PostgreSQL server on loopback (a throwaway cluster, tests/postgres.py), shared by the session; each
    test takes its own database with `postgres.create_database()`."""
    from tests.postgres import PostgresServer

    server = PostgresServer()
    yield server
    server.remove()
