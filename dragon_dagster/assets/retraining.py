"""Retraining from chat feedback, everything a pipeline's `feedback:` section adds: the feedback source and a
dataset per objective (feedback_datasets.py), the objectives' stages in one chain continuing from the deployed
model (objective_stages.py; each skipped when it is off or has no records), the merge, the retrained report
(retrained_report.py), the promotion gate (promotion_gate.py), the job that runs them, and the sensor and
schedule that request it (automation.py). The objectives themselves are one table: engine/pipeline/objectives.py.
"""

from dagster import AssetSelection, define_asset_job

from ..engine.data.checks import pii_check
from ..engine.pipeline import Pipeline
from ..engine.pipeline.objectives import OBJECTIVES
from ..engine.stages.merge.settings import Merge
from .asset_wiring import key, retraining_group
from .automation import PIPELINE_TAG, feedback_schedule, feedback_sensor, retrain_job_name
from .builders import merge_asset
from .checks import asset_checks
from .feedback_datasets import feedback_dataset, feedback_source
from .live_gate import live_gate_sensor
from .objective_stages import objective_stage
from .pool import POOL_EXECUTOR
from .promotion_gate import promotion_check
from .retrained_report import retrained_report

# a feedback dataset's personal data is fixed in the settings of the `feedback:` section or in the store
FEEDBACK_PII_FIX = (
    "Set feedback.pii: redact (placeholders, records kept), delete those records from the feedback store, or "
    "feedback.pii: warn."
)


def build_feedback_defs(pipeline: Pipeline) -> dict:
    """Everything the feedback loop adds to a pipeline with a `feedback:` section."""
    settings = pipeline.feedback
    # every objective's stages in table order: a chain stage continues from the chain stage before it, a stage out
    # of the chain (rlhf's reward model) starts from the deployed model
    stages = [(objective, stage) for objective in OBJECTIVES for stage in settings.trained_by(objective)]
    last = [stage.name for _, stage in stages if stage.in_chain][-1]
    trained, after = [], None
    for objective, stage in stages:
        trained.append(
            objective_stage(pipeline, stage, objective, after if stage.in_chain else None, stage.name == last)
        )
        after = stage.name if stage.in_chain else after
    merge = Merge(name="retrained_model", kind="merge")
    assets = [
        feedback_source(pipeline),
        *(feedback_dataset(pipeline, objective) for objective in OBJECTIVES),
        *trained,
        merge_asset(pipeline, merge, upstream=[last], group=retraining_group(pipeline)),
        retrained_report(pipeline, settings.evaluate),
    ]
    names = [
        *(objective.dataset for objective in OBJECTIVES),
        *(stage.name for _, stage in stages),
        merge.name,
        settings.evaluate.name,
    ]
    job = define_asset_job(
        retrain_job_name(pipeline),
        selection=AssetSelection.assets(*[key(pipeline, n) for n in names]),
        description="Retrain the deployed model on chat feedback.",
        run_tags={PIPELINE_TAG: pipeline.name},
        executor_def=POOL_EXECUTOR,
    )
    return {
        "assets": assets,
        "asset_checks": [
            promotion_check(pipeline, key(pipeline, settings.evaluate.name)),
            *(
                check
                for objective in OBJECTIVES
                for check in asset_checks(key(pipeline, objective.dataset), [pii_check(settings.pii, FEEDBACK_PII_FIX)])
            ),
        ],
        "jobs": [job],
        "sensors": [
            feedback_sensor(pipeline, settings.min_new_records, job),
            *([live_gate_sensor(pipeline)] if settings.gate.live else []),
        ],
        "schedules": [feedback_schedule(pipeline, settings.cron, job)],
    }
