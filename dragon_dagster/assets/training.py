"""What every training asset does around its kind's worker: fail fast, track in MLflow, stage the artifact."""

from __future__ import annotations

import shutil
from pathlib import Path

from dagster import Failure, MetadataValue, Output

from ..engine import catalog, models
from ..engine.artifacts.directories import sha256
from ..engine.artifacts.manifest import AdapterManifest, read_manifest, write_manifest
from ..engine.config.job import ReferencedModel, RewardModelInput, StageArtifact, TrainingInputs
from ..engine.data.tables import DataError, read_jsonl
from ..engine.models import ModelError
from ..engine.pipeline import Pipeline, preflight
from ..engine.release.model_registry import NotRegistered, RegistryError
from ..engine.rewards import RewardSet
from ..engine.train.stage import SCORER, TrainerStage
from ..resources.launchers.base import ENDED
from .metadata import as_metadata, image_markdown
from .mlflow_runs import PROFILE_TAG, log_step, pipeline_run, stage_source
from .prompts import PROMPT_TAG, dataset_prompt_uri, link_prompt
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
    """stage: the effective settings (YAML, defaults and this run's config). start_model: a model directory to
    start from instead of the pipeline's model (feedback retraining). declared: the artifacts of the stages its
    kind declares it reads, by role and stage (stage_inputs.by_role): the reward_model stages its learned rewards
    name (SCORER), a teacher ..."""
    declared = declared or {}
    if start_model is None:  # a pipeline stage: no stage trains while any of the pipeline's data is broken
        found = preflight.problems(pipeline)
        if found:
            raise Failure(
                description=f"{stage.name}: preflight found problems in the pipeline's data; nothing "
                "was trained: " + "; ".join(found)
            )
    previous_manifest = read_manifest(previous, AdapterManifest) if previous else None
    method, settings = stage.objective(), stage.model_dump()  # defaults included: job file and MLflow params
    kind = catalog.kind_of(stage)
    try:  # everything that can be checked before a model loads fails here, with the problem named
        resolved = (
            (previous_manifest.resolved_model if previous_manifest else None)
            or start_model
            or models.check_loadable(pipeline.model)
        )
        rewards = check_rewards(pipeline, stage, dataset)
        reward_models = reward_model_inputs(stage.scorers(), declared.get(SCORER, {}), stage.name)
        referenced = referenced_models(stage, tracking)
    except (ModelError, DataError, ValueError, RegistryError) as exc:
        raise Failure(description=f"{stage.name}: {exc}") from exc
    train_file, eval_file = Path(dataset) / "train.jsonl", Path(dataset) / "eval.jsonl"
    resume_from = None
    if resume:
        checkpoint = store.latest_checkpoint(
            pipeline.name, stage.name, log=context.log.warning, is_live=run_is_live(context.instance)
        )
        if checkpoint is None:
            raise Failure(
                description=f"{stage.name}: resume is true but no complete checkpoint was found under "
                f"{store.root / 'checkpoints' / pipeline.name / stage.name}"
            )
        resume_from = str(checkpoint)
    checkpoint_dir = store.checkpoint_dir(pipeline.name, stage.name, context.op_execution_context.run_id)
    tags = {
        "pipeline": pipeline.name,
        "stage": stage.name,
        "method": method,
        "kind": stage.kind,
        "asset_key": context.asset_key.to_user_string(),
        "dagster_run_id": context.op_execution_context.run_id,
        "base_model": pipeline.model,
        "upstream_mlflow_run_id": previous_manifest.mlflow_run_id if previous_manifest else None,
        "resumed_from": resume_from,
        "started_from": start_model,
        **{f"reward_model.{m.stage}.mlflow_run_id": m.mlflow_run_id for m in reward_models},
        **{f"{m.role}.model": m.spec + (f" (version {m.version})" if m.version else "") for m in referenced},
        **sweep_tags_of(context.run.tags),  # a sweep's point: which sweep, which point, its settings
        **(tags or {}),
    }
    tags.update({f"reward_file.{name}.sha256": digest for name, digest in reward_files(rewards).items()})
    prompt_uri = dataset_prompt_uri(dataset)
    if prompt_uri:
        tags[PROMPT_TAG] = prompt_uri
    # what killed runs left: staging dirs, checkpoints no resume would pick, Pipes folders
    store.clean_leftovers(run_is_live(context.instance), log=context.log.warning)
    for dead in close_dead_runs(tracking, context.instance, pipeline.name, stage.name):
        context.log.warning(
            f"MLflow run {dead} of {stage.name} was left running by a Dagster run that is over: marked KILLED"
        )
    parent = pipeline_run(context, pipeline, tracking)
    with (
        tracking.owning(parent, where=stage.name),  # set running again by the Dagster run's next stage, if any
        tracking.started(
            pipeline.name,
            stage.name,
            tags,
            {
                "model": pipeline.model,
                "method": method,
                **settings,
                "dataset": dataset,
                "hardware": training.hardware(),
                "speed": training.speed(),
            },
            parent=parent,
            description=f"{stage.kind.upper()} stage `{stage.name}` of the {pipeline.name} pipeline ({method}), "
            f"trained on `{Path(dataset).parent.name}`"
            + (f", continuing `{previous_manifest.stage}`" if previous_manifest else f", from `{pipeline.model}`")
            + ".",
            source=stage_source(context),
        ) as run_id,
    ):
        context.log.info(f"MLflow run {run_id}: {tracking.run_url(pipeline.name, run_id)}")
        link_prompt(tracking, run_id, tags.get(PROMPT_TAG))  # the dataset's, or the live one a retraining names
        tracking.log_datasets(
            run_id, Path(dataset), Path(dataset).parent.name, {"training": train_file, "evaluation": eval_file}
        )
        with store.new_artifact(pipeline.name, stage.name, context.op_execution_context.run_id) as (tmp, final):
            (tmp / "data").mkdir()
            for source in (train_file, eval_file):  # the artifact holds the data that reproduces it
                if source.exists():
                    shutil.copyfile(source, tmp / "data" / source.name)
            if rewards is not None:  # custom reward files travel with the run, so it is self-contained
                stage = stage.with_rewards(rewards.localize(tmp))
                settings = stage.model_dump()
            chain = previous_manifest.chain if previous_manifest else []
            job = kind.job_model()(
                settings=stage,
                inputs=TrainingInputs(
                    model=resolved,
                    adapters=chain,
                    train_file=str(tmp / "data" / "train.jsonl"),
                    eval_file=str(tmp / "data" / "eval.jsonl") if eval_file.exists() else None,
                    checkpoint_dir=str(checkpoint_dir),
                    resume_from=resume_from,
                    tools=pipeline.tools.to_input(tmp / "tools") if pipeline.tools else None,
                    reward_models=reward_models,
                    declared=[
                        StageArtifact(role=role, stage=name, path=path)
                        for role, found in declared.items()
                        for name, path in found.items()
                    ],
                    referenced=referenced,
                ),
                output_dir=str(tmp),
            )
            result = training.run_job(
                context,
                job,
                tmp,
                env=tracking.env(),
                store=store,
                final=final,
                on_metrics=lambda step, values: log_step(tracking, run_id, parent, stage.name, step, values),
            )
            write_manifest(
                tmp,
                AdapterManifest[type(result)](
                    stage=stage.name,
                    method=method,
                    base_model=start_model or pipeline.model,
                    resolved_model=resolved,
                    chain=[*chain, str(final / "adapter")],
                    dataset=dataset,
                    previous=previous,
                    settings=settings,
                    mlflow_run_id=run_id,
                    reward_files=reward_files(rewards),
                    upstream_mlflow_run_id=previous_manifest.mlflow_run_id if previous_manifest else None,
                    dagster_run_id=context.op_execution_context.run_id,
                    result=result,
                ),
            )
            tracking.log_artifacts(run_id, [tmp / name for name in ARTIFACTS_TO_MLFLOW])
    # the adapter is saved: this run's checkpoints and the ones it resumed from are moot; another run's are not
    store.discard_checkpoints(pipeline.name, stage.name, context.op_execution_context.run_id, resumed_from=resume_from)
    return Output(
        str(final),
        metadata={
            "artifact_dir": MetadataValue.path(str(final)),
            "mlflow_run_id": run_id,
            "mlflow_run": MetadataValue.url(tracking.run_url(pipeline.name, run_id)),
            "global_step": result.global_step,
            "profile": context.run.tags.get(PROFILE_TAG) or "none",
            **image_markdown("loss_curve", final / "loss.png", f"{stage.name}: training curves"),
            **as_metadata(result.metadata()),
        },
    )
