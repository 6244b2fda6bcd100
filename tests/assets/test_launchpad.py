"""The launchpad edits a stage's settings model field by field: a run's values go into the model (nested ones into
the nested settings), the rest keep their typed values, and a bad value is a Failure naming the field."""

import pytest
from dagster import Failure

from dragon_dagster.assets.launchpad import RESUME, effective, effective_values, launchpad_config
from dragon_dagster.engine import catalog
from dragon_dagster.engine.config.settings import with_values

GRPO_STAGE = {
    "name": "grpo_adapter",
    "kind": "grpo",
    "dataset": "prompts",
    "rewards": [{"type": "numeric", "weight": 2}],
    "args": {"learning_rate": "2e-4", "max_steps": 6},
}


def stage():
    return catalog.parse_stage(dict(GRPO_STAGE))


def test_a_runs_values_go_into_the_model_and_the_rest_keep_their_typed_values():
    grpo = stage()
    run = with_values(grpo, {"beta": 0.2, "args": {"max_steps": 9}})
    assert type(run) is type(grpo) and run.beta == 0.2
    assert run.args.max_steps == 9 and run.args.learning_rate == 2e-4  # nested: only the value given changes
    assert run.rewards[0] is grpo.rewards[0]  # kept as the typed object it was, not dumped and read again
    assert run.model_fields_set == grpo.model_fields_set | {"beta"}  # the kind's defaults stay defaults
    assert grpo.beta != 0.2 and grpo.args.max_steps == 6  # the pipeline's own settings are untouched


def test_the_launchpads_config_puts_its_values_into_the_stage():
    grpo = stage()
    config_class = launchpad_config(grpo, resume=RESUME)
    config = config_class(group_size=4, args={"learning_rate": 1e-5}, resume=True)
    run = effective(grpo, config)
    assert run.group_size == 4 and run.args.learning_rate == 1e-5 and run.args.max_steps == 6
    assert effective(grpo, config_class()) == grpo  # the launchpad opens on the stage's own values


def test_a_bad_run_value_is_a_failure_naming_the_stage_and_the_field():
    with pytest.raises(Failure, match="grpo_adapter: run config: .*args.learning_rate"):
        effective_values(stage(), {"args": {"learning_rate": -1}})
    with pytest.raises(Failure, match="grpo_adapter: run config: .*betta"):
        effective_values(stage(), {"betta": 0.1})
    with pytest.raises(Failure, match="temperature"):  # checked with the stage's other values, by its model
        effective_values(stage(), {"temperature": "hot"})
