"""Champion and challenger on live traffic (issue 60): the server `dragon serve` builds, on loopback, splits its
users 50/50 between two registered versions of the tiny model; the official `openai` client asks as each user;
each rating posted over HTTP lands in the real feedback store with the version that answered; and the live gate
sensor (real MLflow sqlite registry, real Dagster instance) follows the ratings: a challenger rated lower is
refused and the champion stays; a later one rated higher is promoted, and the server swaps to it by itself."""

import json
import socket
import threading
import uuid
from pathlib import Path

import pytest
import requests
from dagster import (
    AssetKey,
    AssetMaterialization,
    DagsterInstance,
    MetadataValue,
    build_asset_check_context,
    build_sensor_context,
)

from dragon_dagster.assets.live_gate import live_gate_sensor
from dragon_dagster.assets.promotion_gate import promotion_check
from dragon_dagster.engine.pipeline import load
from dragon_dagster.engine.release.model_registry import CHALLENGER, CHAMPION, alias_version
from tests.support import wait_until, write_pipeline

MIN_RATINGS = 5
USERS = [f"user-{i}" for i in range(14)]  # 8 challenger and 6 champion users by the server's hash at 0.5


class Live:
    """The tiny pipeline with `gate.live`, its registry and feedback store under one runs directory."""

    def __init__(self, model: Path, tmp_path: Path):
        from dragon_dagster.resources import ArtifactStore, MLflowTracking

        self.tmp, self.model, self.runs = tmp_path, model, tmp_path / "runs"
        self.tracking, self.store = MLflowTracking(runs_dir=str(self.runs)), ArtifactStore(runs_dir=str(self.runs))
        self.client = self.tracking.client()
        self.cursor = None

    def load(self) -> None:
        """The pipeline (the tiny one, with gate.live), its promotion_gate and live gate sensor, a Dagster instance."""
        defs = write_pipeline(self.tmp / "defs", self.model)
        defs.write_text(defs.read_text().replace("gate: {", f"gate: {{live: {{min_ratings: {MIN_RATINGS}}}, ", 1))
        self.pipeline = load(defs)
        assert self.pipeline.feedback.gate.live.alpha == 0.05
        self.instance = DagsterInstance.ephemeral()
        self.report_key = AssetKey(["tiny", "retrained_report"])
        self.gate = promotion_check(self.pipeline, self.report_key)
        self.sensor = live_gate_sensor(self.pipeline)

    def register(self) -> tuple[str, Path]:
        """A new version of `tiny` (the same weights: only the ratings tell the versions apart), on a run of its own."""
        from dragon_dagster.engine.artifacts.manifest import MergedManifest, MergeResult, write_manifest

        merged = self.tmp / f"merged-{uuid.uuid4().hex[:6]}"
        merged.mkdir()
        info = MergeResult(model_dir=str(self.model), size_mb=1.0, parameters=1, sample_prompt="q", sample_reply="a")
        write_manifest(
            merged, MergedManifest(base_model=str(self.model), resolved_model="", adapters=[], info=info, settings={})
        )
        run = self.client.create_run(self.tracking.experiment_id("tiny")).info.run_id
        tags = {"artifact_dir": str(merged), "asset_key": "tiny/retrained_model", "model_dir": str(self.model)}
        return self.tracking.register_model("tiny", self.model, run, tags), merged

    def promotion_gate(self, merged: Path):
        """The retraining's promotion_gate on a passing report of the merged model (no retraining job)."""
        from dragon_dagster.engine.artifacts.manifest import ReportManifest, write_manifest

        report_dir = self.tmp / f"report-{uuid.uuid4().hex[:6]}"
        report_dir.mkdir()
        same = {"eval_loss": 1.0, "metrics": {"token_f1": 0.5}}
        feedback = {"held_out": {"rated_replies": 4}, "reward": {"start": 0.0, "retrained": 0.05, "gain": 0.05}}
        report = {"task": "chat", "held_out": True, "rows": 2, "merged_not_worse": True, "base": same, "merged": same}
        (report_dir / "report.json").write_text(json.dumps({**report, "feedback": feedback}))
        write_manifest(report_dir, ReportManifest(merged=str(merged), dataset="sft_dataset", settings={}))
        self.instance.report_runless_asset_event(
            AssetMaterialization(self.report_key, metadata={"artifact_dir": MetadataValue.path(str(report_dir))})
        )
        context = build_asset_check_context(instance=self.instance, resources=self.resources())
        return self.gate(context)

    def resources(self) -> dict:
        return {"tracking": self.tracking, "store": self.store}

    def tick(self):
        """One evaluation of the live gate sensor, its cursor kept as the daemon keeps it."""
        with build_sensor_context(instance=self.instance, resources=self.resources(), cursor=self.cursor) as context:
            result = self.sensor(context)
        self.cursor = result.cursor
        return result

    def tags(self, version: str) -> dict:
        return self.client.get_model_version("tiny", version).tags

    def aliases(self) -> tuple[str | None, str | None]:
        return alias_version(self.client, "tiny", CHAMPION), alias_version(self.client, "tiny", CHALLENGER)


class Server:
    """`dragon serve tiny --challenger-share 0.5 --watch 0.5 --no-trace` on loopback, on the runs directory's
    registry: the server `dragon serve` builds (serving/launch.py), under uvicorn in a thread of this process (a
    process of its own spends half a minute of a loaded 2-core machine importing what this one has imported)."""

    def __init__(self, runs: Path, monkeypatch):
        import openai
        import uvicorn

        from dragon_dagster.engine.serve.batching import BatchingOptions
        from dragon_dagster.serving.app import create_app
        from dragon_dagster.serving.launch import Options, build

        for name in ("MLFLOW_TRACKING_URI", "DRAGON_FEEDBACK_URL"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("DRAGON_RUNS_DIR", str(runs))
        options = Options(
            ["tiny"], challenger_share=0.5, watch_s=0.5, trace=False, batching=BatchingOptions(cache_tokens=4096)
        )
        server, self.models = build(options)
        self.models.start_watching()
        listening = socket.socket()
        listening.bind(("127.0.0.1", 0))  # bound here and handed over: no other test can take the port first
        self.port = listening.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.uvicorn = uvicorn.Server(uvicorn.Config(create_app(server), log_level="warning"))
        self.thread = threading.Thread(
            target=self.uvicorn.run, kwargs={"sockets": [listening]}, name="dragon-serve-test", daemon=True
        )
        self.thread.start()
        self.client = openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0, timeout=60)

    def exited(self) -> str | None:
        return None if self.thread.is_alive() else "the server's thread ended"

    def ready(self) -> bool:
        try:
            return requests.get(f"{self.url}/health", timeout=1).ok
        except requests.RequestException:
            return False

    def ask(self, user: str, model: str = "tiny"):
        import openai

        try:
            return self.client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": f"hello from {user}"}], max_tokens=2, user=user
            )
        except openai.APIStatusError as exc:
            if exc.status_code == 503:  # a version still loading
                return None
            raise

    def answered_by(self, user: str, model: str = "tiny") -> str:
        """The version (`tiny/2`) that answers this user, waiting while it loads."""
        reply = wait_until(lambda: self.ask(user, model), 60, f"a reply for {user}", self.exited, every=0.5)
        return reply, reply.model

    def rate(self, completion_id: str, user: str, like: bool) -> dict:
        answer = requests.post(
            f"{self.url}/v1/feedback",
            json={"completion_id": completion_id, "rating": "like" if like else "dislike", "user": user},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
        return answer.json()

    def stop(self) -> None:
        self.uvicorn.should_exit = True
        self.thread.join(timeout=15)
        self.models.close()


def traffic(server: Server, liked: str) -> dict[str, list[str]]:
    """Every user asks once and rates the reply: liked when `liked` (a version, `tiny/3`) answered, else not;
    which users each version answered."""
    served: dict[str, list[str]] = {}
    for user in USERS:
        reply, version = server.answered_by(user)
        assert server.rate(reply.id, user, like=version == liked)["model"] == version
        served.setdefault(version, []).append(user)
    return served


def test_a_50_50_split_rated_by_version_moves_the_liked_rates_and_the_live_gate(chatty_model, tmp_path, monkeypatch):
    live = Live(chatty_model, tmp_path)
    one, _ = live.register()
    live.tracking.promote("tiny", one, "the first champion")
    two, merged_two = live.register()
    assert live.aliases() == (one, two)
    live.load()

    # the retraining's gate passes on held-out feedback, but under gate.live it promotes no one yet
    passed = live.promotion_gate(merged_two)
    assert passed.passed, passed.metadata["decision"].value
    assert passed.metadata["decision"].value.startswith("passed: reward gain above 0.0 and no task regression; ")
    assert f"models:/tiny/{two} stays the challenger" in passed.metadata["live_gate"].value
    assert live.aliases() == (one, two)
    assert live.tags(two)["live_gate"] == "waiting" and live.tags(two)["live_against"] == one
    waiting = live.tick()
    assert waiting.skip_reason.skip_message.startswith("waiting for live ratings: tiny/2 (challenger) has 0")
    assert waiting.skip_reason.skip_message.endswith("is `dragon serve --challenger-share` set?")

    server = Server(live.runs, monkeypatch)
    try:
        wait_until(server.ready, 120, "dragon serve's /health", server.exited)
        assert server.answered_by(USERS[0], "tiny@challenger")[1] == f"tiny/{two}"  # loaded (503s until then)
        for user in USERS[:2]:  # sticky: a user meets one version, request after request
            assert len({server.answered_by(user)[1] for _ in range(3)}) == 1

        # the challenger's replies are disliked, the champion's liked
        served = traffic(server, liked=f"tiny/{one}")
        assert set(served) == {f"tiny/{one}", f"tiny/{two}"}, served
        assert min(len(users) for users in served.values()) >= MIN_RATINGS, served
        refused = live.tick()
        said = refused.skip_reason.skip_message
        assert said.startswith(f"refused: tiny/{two} liked 0/{MIN_RATINGS} against tiny/{one}'s 5/5"), said
        assert live.aliases() == (one, two), "a challenger rated lower is not promoted"
        assert live.tags(two)["live_gate"] == "refused" and float(live.tags(two)["live_p_value"]) < 0.05
        first_champion_users = served[f"tiny/{one}"]
        assert live.tags(one)["live_liked_rate"] == "1.0000"
        assert live.tags(one)["live_rated"] == str(len(first_champion_users))
        assert live.tags(two)["live_liked_rate"] == "0.0000" and live.tags(two)["live_liked"] == "0"
        run = live.client.get_model_version("tiny", two).run_id
        assert [m.value for m in live.client.get_metric_history(run, "live/liked_rate")] == [0.0]
        [seen] = refused.asset_events
        assert seen.asset_key == AssetKey(["tiny", "retrained_model"]) and seen.description == said
        assert seen.metadata[f"live/tiny/{one}/liked_rate"].value == 1.0
        assert seen.metadata["tested/challenger"].value == f"0/{MIN_RATINGS}"
        assert "| tiny/2 | challenger | 0 |" in seen.metadata["liked_rates"].value
        assert live.tick().asset_events == [], "nothing new: no second observation"

        # a new retraining's model, rated higher than the champion, counted from its own gate on
        three, merged_three = live.register()
        assert live.promotion_gate(merged_three).passed and live.aliases() == (one, three)
        assert live.tags(three)["live_from"] == str(len(USERS))
        wait_until(lambda: server.answered_by(USERS[0], "tiny@challenger")[1] == f"tiny/{three}", 60,
                   "the server swapping its challenger", server.exited)  # fmt: skip
        served = traffic(server, liked=f"tiny/{three}")
        assert served[f"tiny/{one}"] == first_champion_users and set(served) == {f"tiny/{one}", f"tiny/{three}"}
        promoted = live.tick()
        said = promoted.skip_reason.skip_message
        assert said.startswith(f"promoted: tiny/{three} liked 5/5 against tiny/{one}'s 0/5"), said
        assert live.aliases() == (three, three)
        assert live.tags(three)["promoted"].startswith("tiny_live_gate_sensor: promoted: ")
        assert live.tags(one)["live_liked_rate"] == "0.5000"  # liked in the first round, disliked in the second
        assert live.tags(three)["live_liked_rate"] == "1.0000"

        # the server follows the registry by itself: the champion's users are now answered by the promoted version
        user = first_champion_users[0]
        wait_until(lambda: server.answered_by(user)[1] == f"tiny/{three}", 60, "the hot swap", server.exited)
        assert {server.answered_by(u)[1] for u in first_champion_users} == {f"tiny/{three}"}
    finally:
        server.stop()


def test_a_look_with_no_new_rating_reads_none(tiny_model, tmp_path, monkeypatch):
    """The live gate sensor asks the store for its newest id first: a tick with no new record and the same aliases
    counts nothing at all; a new record makes the next tick have the store count them (verdict_counts, a GROUP BY:
    never every rating read, seconds at a million records) and show the new counts."""
    from dragon_dagster.engine.data.feedback.sqlite import SQLiteFeedbackStore

    live = Live(tiny_model, tmp_path)
    live.load()
    live.register()
    store = live.store.feedback_store("tiny")
    for verdict in ("up", "down", "up"):
        store.record("c", [{"role": "user", "content": "q"}], "a", verdict, model="models:/tiny/1")
    reads = []
    read = SQLiteFeedbackStore.verdict_counts
    monkeypatch.setattr(
        SQLiteFeedbackStore, "verdict_counts", lambda self, *a, **kw: reads.append(1) or read(self, *a, **kw)
    )
    monkeypatch.setattr(SQLiteFeedbackStore, "ratings", lambda *a, **kw: pytest.fail("every rating read"))
    first = live.tick()
    assert len(reads) == 1 and len(first.asset_events) == 1
    assert live.tick().asset_events == [] and len(reads) == 1  # nothing new: no rating read
    store.record("c", [{"role": "user", "content": "q"}], "a", "up", model="models:/tiny/1")
    assert len(live.tick().asset_events) == 1 and len(reads) == 2
    assert live.tags("1")["live_rated"] == "4" and live.tags("1")["live_liked"] == "3"
