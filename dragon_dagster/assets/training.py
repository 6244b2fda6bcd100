"""What every training asset does around its kind's worker: fail fast, track in MLflow, stage the artifact."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from dagster import Failure, MetadataValue, Output

from ..engine import catalog, models
from ..engine.artifacts.directories import sha256
from ..engine.artifacts.manifest import AdapterManifest, read_manifest, write_manifest
from ..engine.config.job import ReferencedModel, RewardModelInput, StageArtifact, TrainingInputs
from ..engine.data.errors import DataError
from ..engine.data.tables import read_jsonl
from ..engine.models import ModelError
from ..engine.pipeline import Pipeline, preflight
from ..engine.release.model_registry import NotRegistered, RegistryError
from ..engine.rewards import RewardSet
from ..engine.train.stage import SCORER, TrainerStage
from ..resources.launchers.base import ENDED
from .metadata import as_metadata, image_markdown
from .mlflow_runs import PROFILE_TAG, log_step
from .prompts import PROMPT_TAG, dataset_prompt_uri
from .stage_runs import StageRun, stage_run
from .sweep_tags import sweep_tags_of

ARTIFACTS_TO_MLFLOW = (
    "job.json",
    "metrics.json",
    "samples.jsonl",
    "progress.jsonl",
    "loss.png",
    "adapter/adapter_config.json",
)


def check_rewards(pipeline: Pipeline, stage: TrainerStage, dataset: str) -> RewardSet | None:
    """The rewards a stage trains against, checked against the dataset's rows before anything loads; None for a
    stage without rewards. Custom reward files are not imported here: only the worker runs their code."""
    used = stage.rewards_used()
    if not used:
        return None
    base = Path(pipeline.source_file).parent if pipeline.source_file else None
    rewards = RewardSet(used, base_dir=base)
    rewards.check_rows(read_jsonl(Path(dataset) / "train.jsonl"), load_custom=False)  # e.g. numeric w/o reference
    return rewards


def reward_model_inputs(names: list[str], scorers: dict[str, str], user: str) -> list[RewardModelInput]:
    """The reward models of the stages named (the learned rewards of `user`), from their artifacts (the asset's
    scorer inputs, by stage name)."""
    out = []
    for name in names:
        if name not in scorers:
            raise ValueError(f"the reward model of stage {name!r} was not given to {user!r}")
        manifest = read_manifest(scorers[name], AdapterManifest)
        if not catalog.scores_replies(manifest.settings.kind):
            raise ValueError(f"{name!r} is a {manifest.method} adapter, not a reward model")
        out.append(
            RewardModelInput(
                stage=name,
                model=manifest.resolved_model,
                adapter=str(Path(scorers[name]) / "adapter"),
                mlflow_run_id=manifest.mlflow_run_id,
            )
        )
    return out


def referenced_models(stage: TrainerStage, tracking) -> list[ReferencedModel]:
    """The models the stage names by where they are (a teacher ...), resolved: a registered model to its local
    directory and the version its alias names now, a preset or directory to what from_pretrained loads."""
    out = []
    for ref in stage.model_references():
        if ref.spec.startswith("models:/"):
            try:
                path, version = tracking.resolve_version(ref.spec)
            except NotRegistered as exc:
                raise ValueError(
                    f"its {ref.role} {exc}. Register that model first (a pipeline's merged model becomes "
                    "models:/<pipeline>@champion when it passes its gate: run that pipeline), or name another"
                ) from exc
            out.append(ReferencedModel(role=ref.role, spec=ref.spec, path=str(path), version=version))
        else:
            out.append(ReferencedModel(role=ref.role, spec=ref.spec, path=models.check_loadable(ref.spec)))
    return out


def reward_files(rewards) -> dict[str, str]:
    """sha256 of each custom reward file, by reward name: what ran is on record in the manifest and MLflow."""
    return {r.name: sha256(Path(r.file)) for r in rewards or [] if r.type == "custom"}


def run_is_live(instance):
    """Whether a Dagster run id belongs to a run still going (queued to cancelling): its files are in use."""
    from dagster import DagsterRunStatus

    going = {
        DagsterRunStatus.QUEUED,
        DagsterRunStatus.NOT_STARTED,
        DagsterRunStatus.STARTING,
        DagsterRunStatus.STARTED,
        DagsterRunStatus.CANCELING,
    }

    def is_live(run_id: str) -> bool:
        run = instance.get_run_by_id(run_id)
        return run is not None and run.status in going

    return is_live


def close_dead_runs(tracking, instance, pipeline: str, stage: str) -> list[str]:
    """End as KILLED the MLflow runs of this stage still RUNNING for a Dagster run that is over: their step
    process was killed before it could end them. Returns their ids."""
    client = tracking.client()
    closed = []
    for run in client.search_runs(
        [tracking.experiment_id(pipeline)], f"attributes.status = 'RUNNING' and tags.stage = '{stage}'"
    ):
        dagster_run = instance.get_run_by_id(run.data.tags.get("dagster_run_id", ""))
        if dagster_run is not None and dagster_run.status in ENDED:  # never touch another instance's runs
            client.set_terminated(run.info.run_id, "KILLED")
            closed.append(run.info.run_id)
    return closed


@dataclass(frozen=True)
class CheckedInputs:
    """What a training stage starts from, resolved and checked before any model loads."""

    previous: AdapterManifest | None  # the manifest of the stage it continues, if any
    model: str  # the model its adapter chain starts from, as from_pretrained loads it
    rewards: RewardSet | None
    reward_models: list[RewardModelInput]
    referenced: list[ReferencedModel]
    resume_from: str | None  # the checkpoint a resumed run continues
    checkpoint_dir: Path  # where this run's checkpoints go

    @property
    def chain(self) -> list[str]:
        """The adapters the stage trains on top of."""
        return self.previous.chain if self.previous else []

    @property
    def upstream_run(self) -> str | None:
        """The MLflow run of the stage it continues."""
        return self.previous.mlflow_run_id if self.previous else None


class TrainingStageRun:
    """One training stage's work in a Dagster step, a method per job: `inputs` checks and resolves what it starts
    from (failing before anything loads), `job` stages its data in the artifact being made, `launch` runs the
    worker, `record` writes the manifest and logs files to MLflow, `materialize` makes the asset's Output. `run`
    does them in order inside the stage's MLflow run (stage_runs.stage_run).

    stage: the effective settings (YAML, defaults and this run's config). start_model: a model directory to start
    from instead of the pipeline's model (feedback retraining). tags: more tags for its MLflow run. declared: the
    artifacts of the stages its kind declares it reads, by role and stage (stage_inputs.by_role): the reward_model
    stages its learned rewards name (SCORER), a teacher ..."""

    def __init__(
        self,
        context,
        pipeline: Pipeline,
        stage: TrainerStage,
        store,
        tracking,
        training,
        *,
        dataset: str,
        previous: str | None = None,
        resume: bool = False,
        start_model: str | None = None,
        tags: dict | None = None,
        declared: dict[str, dict[str, str]] | None = None,
    ):
        self.context, self.pipeline, self.stage = context, pipeline, stage
        self.store, self.tracking, self.training = store, tracking, training
        self.dataset, self.previous, self.resume, self.start_model = dataset, previous, resume, start_model
        self.extra_tags, self.declared = tags or {}, declared or {}
        self.run_id = context.op_execution_context.run_id  # the Dagster run's
        self.train_file, self.eval_file = Path(dataset) / "train.jsonl", Path(dataset) / "eval.jsonl"

    def run(self) -> Output[str]:
        """The stage's work, start to end: its artifact's path and metadata as the asset's Output."""
        checked = self.inputs()
        tags = self.tags(checked)
        self.clear_leftovers()
        pipeline, stage = self.pipeline, self.stage
        with (
            stage_run(
                self.context,
                pipeline,
                self.tracking,
                stage.name,
                tags,
                self.params(),
                self.description(checked),
                prompt=tags.get(PROMPT_TAG),  # the dataset's, or the live one a retraining names
                dataset=self.dataset,
            ) as run,
            self.store.new_artifact(pipeline.name, stage.name, self.run_id) as (tmp, final),
        ):
            job = self.job(checked, tmp)
            result = self.launch(job, run, tmp, final)
            self.record(checked, job, result, run, tmp, final)
        # the adapter is saved: this run's checkpoints and the ones it resumed from are moot; another run's are not
        self.store.discard_checkpoints(pipeline.name, stage.name, self.run_id, resumed_from=checked.resume_from)
        return self.materialize(run, result, final)

    def inputs(self) -> CheckedInputs:
        """Everything that can be checked before a model loads, each problem a Failure naming it: the pipeline's
        data (preflight), the model, rewards, reward models and referenced models, the checkpoint to resume; and
        this run's checkpoint directory, made before leftovers are cleared."""
        pipeline, stage = self.pipeline, self.stage
        if self.start_model is None:  # a pipeline stage: no stage trains while any of the pipeline's data is broken
            found = preflight.problems(pipeline)
            if found:
                raise Failure(
                    description=f"{stage.name}: preflight found problems in the pipeline's data; nothing "
                    "was trained: " + "; ".join(found)
                )
        previous = read_manifest(self.previous, AdapterManifest) if self.previous else None
        try:
            model = (
                (previous.resolved_model if previous else None)
                or self.start_model
                or models.check_loadable(pipeline.model)
            )
            rewards = check_rewards(pipeline, stage, self.dataset)
            reward_models = reward_model_inputs(stage.scorers(), self.declared.get(SCORER, {}), stage.name)
            referenced = referenced_models(stage, self.tracking)
        except (ModelError, DataError, ValueError, RegistryError) as exc:
            raise Failure(description=f"{stage.name}: {exc}") from exc
        resume_from = self.resume_checkpoint()
        checkpoint_dir = self.store.checkpoint_dir(pipeline.name, stage.name, self.run_id)
        return CheckedInputs(previous, model, rewards, reward_models, referenced, resume_from, checkpoint_dir)

    def resume_checkpoint(self) -> str | None:
        """The latest complete checkpoint of this stage when the run resumes (a Failure when there is none)."""
        if not self.resume:
            return None
        pipeline, stage = self.pipeline, self.stage
        checkpoint = self.store.latest_checkpoint(
            pipeline.name, stage.name, log=self.context.log.warning, is_live=run_is_live(self.context.instance)
        )
        if checkpoint is None:
            raise Failure(
                description=f"{stage.name}: resume is true but no complete checkpoint was found under "
                f"{self.store.root / 'checkpoints' / pipeline.name / stage.name}"
            )
        return str(checkpoint)

    def tags(self, checked: CheckedInputs) -> dict:
        """The tags of the stage's MLflow run: what it is, where it started from, what scored it, what ran."""
        context, pipeline, stage, referenced = self.context, self.pipeline, self.stage, checked.referenced
        tags = {
            "pipeline": pipeline.name,
            "stage": stage.name,
            "method": stage.objective(),
            "kind": stage.kind,
            "asset_key": context.asset_key.to_user_string(),
            "dagster_run_id": self.run_id,
            "base_model": pipeline.model,
            "upstream_mlflow_run_id": checked.upstream_run,
            "resumed_from": checked.resume_from,
            "started_from": self.start_model,
            **{f"reward_model.{m.stage}.mlflow_run_id": m.mlflow_run_id for m in checked.reward_models},
            **{f"{m.role}.model": m.spec + (f" (version {m.version})" if m.version else "") for m in referenced},
            **sweep_tags_of(context.run.tags),  # a sweep's point: which sweep, which point, its settings
            **self.extra_tags,
        }
        tags.update({f"reward_file.{name}.sha256": digest for name, digest in reward_files(checked.rewards).items()})
        prompt_uri = dataset_prompt_uri(self.dataset)
        if prompt_uri:
            tags[PROMPT_TAG] = prompt_uri
        return tags

    def params(self) -> dict:
        """The params of the stage's MLflow run: every setting, defaults included, and where it ran."""
        return {
            "model": self.pipeline.model,
            "method": self.stage.objective(),
            **self.stage.model_dump(),
            "dataset": self.dataset,
            "hardware": self.training.hardware(),
            "speed": self.training.speed(),
        }

    def description(self, checked: CheckedInputs) -> str:
        stage, pipeline = self.stage, self.pipeline
        return (
            f"{stage.kind.upper()} stage `{stage.name}` of the {pipeline.name} pipeline ({stage.objective()}), "
            f"trained on `{Path(self.dataset).parent.name}`"
            + (f", continuing `{checked.previous.stage}`" if checked.previous else f", from `{pipeline.model}`")
            + "."
        )

    def clear_leftovers(self) -> None:
        """What killed runs left: staging dirs, checkpoints no resume would pick, Pipes folders, and this stage's
        MLflow runs still RUNNING for a Dagster run that is over."""
        context, store = self.context, self.store
        store.clean_leftovers(run_is_live(context.instance), log=context.log.warning)
        for dead in close_dead_runs(self.tracking, context.instance, self.pipeline.name, self.stage.name):
            context.log.warning(
                f"MLflow run {dead} of {self.stage.name} was left running by a Dagster run that is over: marked KILLED"
            )

    def job(self, checked: CheckedInputs, tmp: Path):
        """The worker's job, its data copied into the artifact being made (`tmp`) so the artifact reproduces it,
        and custom reward files with it, so the run is self-contained."""
        pipeline, stage = self.pipeline, self.stage
        (tmp / "data").mkdir()
        for source in (self.train_file, self.eval_file):
            if source.exists():
                shutil.copyfile(source, tmp / "data" / source.name)
        if checked.rewards is not None:
            stage = stage.with_rewards(checked.rewards.localize(tmp))
        return catalog.kind_of(stage).job_model()(
            settings=stage,
            inputs=TrainingInputs(
                model=checked.model,
                adapters=checked.chain,
                train_file=str(tmp / "data" / "train.jsonl"),
                eval_file=str(tmp / "data" / "eval.jsonl") if self.eval_file.exists() else None,
                checkpoint_dir=str(checked.checkpoint_dir),
                resume_from=checked.resume_from,
                tools=pipeline.tools.to_input(tmp / "tools") if pipeline.tools else None,
                reward_models=checked.reward_models,
                declared=[
                    StageArtifact(role=role, stage=name, path=path)
                    for role, found in self.declared.items()
                    for name, path in found.items()
                ],
                referenced=checked.referenced,
            ),
            output_dir=str(tmp),
        )

    def launch(self, job, run: StageRun, tmp: Path, final: Path):
        """The job run by the training resource; each step's figures go to the stage's and the pipeline's run."""
        tracking, name = self.tracking, self.stage.name
        return self.training.run_job(
            self.context,
            job,
            tmp,
            env=tracking.env(),
            store=self.store,
            final=final,
            on_metrics=lambda step, values: log_step(tracking, run.id, run.parent, name, step, values),
        )

    def record(self, checked: CheckedInputs, job, result, run: StageRun, tmp: Path, final: Path) -> None:
        """The artifact's manifest (what made it: settings as the job ran them, inputs, runs, result), and its
        files on the stage's MLflow run."""
        pipeline, stage = self.pipeline, self.stage
        write_manifest(
            tmp,
            AdapterManifest[type(result)](
                stage=stage.name,
                method=stage.objective(),
                base_model=self.start_model or pipeline.model,
                resolved_model=checked.model,
                chain=[*checked.chain, str(final / "adapter")],
                dataset=self.dataset,
                previous=self.previous,
                settings=job.settings,
                mlflow_run_id=run.id,
                reward_files=reward_files(checked.rewards),
                upstream_mlflow_run_id=checked.upstream_run,
                dagster_run_id=self.run_id,
                result=result,
            ),
        )
        self.tracking.log_artifacts(run.id, [tmp / name for name in ARTIFACTS_TO_MLFLOW])

    def materialize(self, run: StageRun, result, final: Path) -> Output[str]:
        return Output(
            str(final),
            metadata={
                "artifact_dir": MetadataValue.path(str(final)),
                "mlflow_run_id": run.id,
                "mlflow_run": MetadataValue.url(self.tracking.run_url(self.pipeline.name, run.id)),
                "global_step": result.global_step,
                "profile": self.context.run.tags.get(PROFILE_TAG) or "none",
                **image_markdown("loss_curve", final / "loss.png", f"{self.stage.name}: training curves"),
                **as_metadata(result.metadata()),
            },
        )


def run_training_stage(
    context,
    pipeline: Pipeline,
    stage: TrainerStage,
    dataset: str,
    previous: str | None,
    resume: bool,
    store,
    tracking,
    training,
    start_model: str | None = None,
    tags: dict | None = None,
    declared: dict[str, dict[str, str]] | None = None,
) -> Output[str]:
    """A training asset's work (TrainingStageRun, which says what each argument is)."""
    return TrainingStageRun(
        context,
        pipeline,
        stage,
        store,
        tracking,
        training,
        dataset=dataset,
        previous=previous,
        resume=resume,
        start_model=start_model,
        tags=tags,
        declared=declared,
    ).run()
