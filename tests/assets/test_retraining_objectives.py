"""Retraining's objectives are one table (engine/pipeline/objectives.py): every row reaches the YAML, a dataset
asset, its stages in the chain and the report, and no other module names an objective. Definitions only, no run."""

import ast
import typing
from pathlib import Path

import pytest
from dagster import AssetKey, AssetsDefinition, Failure, build_asset_context

import dragon_dagster
from dragon_dagster.assets.automation import retrain_job_name
from dragon_dagster.assets.factory import build_pipeline_defs
from dragon_dagster.assets.objective_stages import passed_on
from dragon_dagster.engine.pipeline import PipelineError, parse
from dragon_dagster.engine.pipeline.objectives import NAMES, OBJECTIVES, Skipped
from dragon_dagster.engine.pipeline.retraining import Feedback

PACKAGE = Path(dragon_dagster.__file__).parent
STAGES = [
    {"name": "d", "kind": "chat_dataset", "path": "x.csv", "prompt": "p", "response": "r"},
    {"name": "s", "kind": "sft", "dataset": "d"},
    {"name": "m", "kind": "merge"},
]


def test_every_objective_in_the_table_is_reachable():
    pipeline = parse({"name": "p", "stages": STAGES, "feedback": {"objectives": list(NAMES)}})
    parts = build_pipeline_defs(pipeline)
    assets = {a.key.path[-1]: a for a in parts["assets"] if isinstance(a, AssetsDefinition)}
    job = next(j for j in parts["jobs"] if j.name == retrain_job_name(pipeline)).selection.resolve(parts["assets"])
    report = assets[pipeline.feedback.evaluate.name]
    chain = []
    for objective in OBJECTIVES:
        assert Feedback(objectives=[objective.name]).objectives == [objective.name]  # the YAML takes it
        stages = pipeline.feedback.trained_by(objective)
        assert stages and stages[-1].in_chain and stages[-1].dataset == objective.dataset, objective.name
        dataset = AssetKey(["p", objective.dataset])
        assert dataset in job and dataset in report.asset_deps[report.key], objective.name
        for stage in stages:
            assert AssetKey(["p", stage.name]) in job, stage.name
            assert dataset in assets[stage.name].asset_deps[assets[stage.name].key] or not stage.in_chain
        chain.append(stages[-1].name)
    # the chain runs in table order: each objective's stage continues from the one before it, the merge folds the last
    for before, after in zip(chain, chain[1:]):
        assert AssetKey(["p", before]) in assets[after].asset_deps[assets[after].key], (before, after)
    assert AssetKey(["p", chain[-1]]) in assets["retrained_model"].asset_deps[assets["retrained_model"].key]
    assert typing.get_args(typing.get_args(Feedback.model_fields["objectives"].annotation)[0]) == NAMES
    with pytest.raises(PipelineError, match="'sft', 'dpo', 'kto' or 'rlhf'"):
        parse({"name": "p", "stages": STAGES, "feedback": {"objectives": ["rlfh"]}})


# The modules besides the table that name an objective, each for a reason of its own: the stage kinds named like
# the objectives they train (sft, dpo, kto), the `feedback:` settings whose fields and fixed dataset names are the
# YAML's (the test above holds them equal to the table's), and the data layer's record ids per objective.
NAMED_ELSEWHERE = {"engine/catalog.py", "engine/pipeline/retraining.py", "engine/data/feedback_rows.py"}


def test_the_table_is_the_only_place_an_objective_is_named():
    names = {o.name for o in OBJECTIVES} | {o.dataset for o in OBJECTIVES}
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel in NAMED_ELSEWHERE | {"engine/pipeline/objectives.py"} or rel.startswith("engine/stages/"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in names:
                found.append(f"{rel}:{node.lineno} names {node.value!r}")
    assert not found, "\n".join(found)
    # and the scan sees names where they are: the table itself would be found
    table = ast.parse((PACKAGE / "engine/pipeline/objectives.py").read_text())
    assert names <= {n.value for n in ast.walk(table) if isinstance(n, ast.Constant)}


def test_a_skipped_stage_passes_the_chain_on_and_the_last_fails_when_nothing_trained():
    pipeline = parse({"name": "p", "stages": STAGES, "feedback": {"objectives": ["rlhf"]}})
    grpo = pipeline.feedback.rlhf
    context = build_asset_context()
    passed = passed_on(context, grpo, "/runs/p/kto_on_feedback/1", Skipped("no rated prompts"), last=True)
    assert passed.value == "/runs/p/kto_on_feedback/1" and passed.metadata["skipped"].value == "no rated prompts"
    nothing_yet = passed_on(context, pipeline.feedback.sft, None, Skipped("no liked or edited replies"), last=False)
    assert nothing_yet.value is None and "artifact_dir" not in nothing_yet.metadata
    with pytest.raises(Failure, match="rlhf_on_feedback: no reward model .* no objective before it trained"):
        passed_on(context, grpo, None, Skipped("no reward model (feedback_reward_model was skipped)"), last=True)
