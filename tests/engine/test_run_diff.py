"""Two pipeline runs told apart by their settings' typed values: each logged text read with the type of the field
its path names in the stage's kind's model, shown as it was logged."""

from dragon_dagster.engine.run_diff import PipelineRunSettings, differences


def run(**settings: str) -> PipelineRunSettings:
    logged = {
        "sft_adapter.kind": "sft",
        "dpo_adapter.kind": "dpo",
        **{k.replace("__", "."): v for k, v in settings.items()},
    }
    return PipelineRunSettings("d", "r", versions={"sft_adapter": "v1"}, settings=logged)


def test_the_same_value_written_otherwise_is_no_difference():
    a = run(
        sft_adapter__args__learning_rate="2e-4", sft_adapter__args__max_steps="None", dpo_adapter__loss_type='["ipo"]'
    )
    b = run(
        sft_adapter__args__learning_rate="0.0002", sft_adapter__args__max_steps="None", dpo_adapter__loss_type="ipo"
    )
    assert a.value("sft_adapter.args.learning_rate") == 2e-4 and a.value("sft_adapter.args.max_steps") is None
    assert b.value("dpo_adapter.loss_type") == ["ipo"]  # one loss type is read as the list the model makes of it
    assert differences(a, b) == []


def test_a_changed_value_is_shown_as_logged_and_an_unknown_setting_as_text():
    a = run(
        sft_adapter__args__learning_rate="2e-4",
        dpo_adapter__gone="1",
        sft_adapter__args__gradient_checkpointing="False",
    )
    b = run(
        sft_adapter__args__learning_rate="3e-4",
        dpo_adapter__gone="1.0",
        sft_adapter__args__gradient_checkpointing="false",
    )
    b.versions["sft_adapter"] = "v2"
    assert a.value("dpo_adapter.gone") == "1"  # no such field: the text
    assert differences(a, b) == [
        ("dpo_adapter.gone", "1", "1.0"),
        ("sft_adapter.args.learning_rate", "2e-4", "3e-4"),
        ("version of sft_adapter", "v1", "v2"),
    ]
