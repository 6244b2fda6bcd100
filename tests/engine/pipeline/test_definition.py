"""The pipeline's YAML and the stage models: one typed shape from YAML through the launchpad to the worker."""

import json
import re
from pathlib import Path

import pytest

import dragon_dagster
from dragon_dagster.engine.catalog import KINDS, parse_stage
from dragon_dagster.engine.config.training import TrainArgs
from dragon_dagster.engine.pipeline import Pipeline, PipelineError, load
from dragon_dagster.engine.stages.dpo.settings import DPO
from dragon_dagster.engine.stages.grpo.settings import GRPO
from dragon_dagster.engine.stages.sft.settings import SFT
from tests.support import component_yaml

BUNDLED = Path(dragon_dagster.__file__).resolve().parent / "defs" / "support" / "defs.yaml"

# One valid stage of every kind, in an order that wires (each names only what comes before it).
EVERY_KIND = """\
name: every
datasets:
  tickets: {path: example:tickets.csv}
stages:
  - {name: chat, kind: chat_dataset, source: tickets, prompt: "{subject}", response: reply}
  - {name: pairs_file, kind: pairs_dataset, source: tickets, prompt: subject, chosen: reply, rejected: body}
  - {name: prompts, kind: prompt_dataset, path: example:arithmetic.csv, prompt: question, reference: answer}
  - {name: teacher_rows, kind: synthetic_dataset, dataset: chat, teacher: reference}
  - {name: sft, kind: sft, dataset: chat}
  - {name: pairs, kind: preference_pairs, dataset: chat}
  - {name: dpo, kind: dpo, dataset: pairs}
  - {name: grpo, kind: grpo, dataset: prompts, rewards: [{type: numeric}]}
  - {name: merged, kind: merge}
  - {name: report, kind: evaluate, dataset: chat}
  - {name: gguf, kind: export, model: merged}
  - {name: rated, kind: rated_dataset, source: tickets, prompt: subject, reply: reply, label: product}
  - {name: orpo, kind: orpo, dataset: pairs_file}
  - {name: kto, kind: kto, dataset: rated}
  - {name: rm, kind: reward_model, dataset: pairs_file}
  - {name: rloo, kind: rloo, dataset: prompts, rewards: [{type: numeric, name: right}]}
  - {name: distill, kind: distill, dataset: prompts, teacher: {stage: sft}, student: base}
  - {name: sft_beside, kind: sft, dataset: chat, start: base}
  - {name: combined, kind: merge_adapters, adapters: [sft, sft_beside], combination: ties, density: 0.5}
"""
# A bad value per kind: (what to replace in EVERY_KIND, its replacement, the field the error must name)
BAD = {
    "chat_dataset": ("response: reply}", "response: reply, eval_frac: 1.5}", "stages[0].eval_frac"),
    "pairs_dataset": ("rejected: body}", "rejected: body, seed: many}", "stages[1].seed"),
    "prompt_dataset": ("reference: answer}", "reference: answer, referense: x}", "stages[2].referense"),
    "synthetic_dataset": ("teacher: reference}", "teacher: reference, min_score: 11}", "stages[3].min_score"),
    "sft": (
        "kind: sft, dataset: chat}",
        "kind: sft, dataset: chat, args: {learning_rate: abc}}",
        "stages[4].args.learning_rate",
    ),
    "preference_pairs": (
        "kind: preference_pairs, dataset: chat}",
        "kind: preference_pairs, dataset: chat, mode: judge, n_samples_per_prompt: 1}",
        "stages[5]",
    ),
    "dpo": ("kind: dpo, dataset: pairs}", "kind: dpo, dataset: pairs, beta: -1}", "stages[6].beta"),
    "grpo": ("[{type: numeric}]}", "[{type: numeric}], group_size: 1}", "stages[7].group_size"),
    "merge": ("kind: merge}", "kind: merge, sample_prompt: [not, text]}", "stages[8].sample_prompt"),
    "evaluate": ("kind: evaluate, dataset: chat}", "kind: evaluate, dataset: chat, n_judge: -1}", "stages[9].n_judge"),
    "export": (
        "kind: export, model: merged}",
        "kind: export, model: merged, formats: [q4_k]}",
        "stages[10].formats[0]",
    ),
    "rated_dataset": ("label: product}", "label: product, eval_frac: -1}", "stages[11].eval_frac"),
    "orpo": ("kind: orpo, dataset: pairs_file}", "kind: orpo, dataset: pairs_file, beta: 0}", "stages[12].beta"),
    "kto": ("dataset: rated}", "dataset: rated, args: {batch_size: 1}}", "stages[13]"),
    "reward_model": (
        "kind: reward_model, dataset: pairs_file}",
        "kind: reward_model, dataset: pairs_file, min_accuracy: 2}",
        "stages[14].min_accuracy",
    ),
    "rloo": ("name: right}]}", "name: right}], reward_clip_range: [3, 1]}", "stages[15]"),
    "distill": ("student: base}", "student: base, beta: 2}", "stages[16].beta"),
    "merge_adapters": ("density: 0.5}", "density: 1.5}", "stages[18].density"),
}


def write(tmp_path: Path, text: str, component: bool = True) -> Path:
    path = tmp_path / "defs.yaml"
    path.write_text(component_yaml(text) if component else text)
    return path


def test_bundled_support_pipeline_has_the_documented_chain():
    support = load(BUNDLED)
    assert list(support.datasets) == ["tickets"]
    assert [s.name for s in support.stages] == [
        "sft_dataset",
        "sft_adapter",
        "preference_pairs",
        "dpo_adapter",
        "arithmetic_prompts",
        "grpo_adapter",
        "merged_model",
        "evaluation_report",
        "gguf_export",
    ]
    upstream = {s.name: support.upstream(s.name) for s in support.stages}
    assert upstream == {
        "sft_dataset": ["tickets"],
        "sft_adapter": ["sft_dataset"],
        "preference_pairs": ["sft_dataset", "sft_adapter"],
        "dpo_adapter": ["preference_pairs", "sft_adapter"],
        "arithmetic_prompts": [],
        "grpo_adapter": ["arithmetic_prompts", "dpo_adapter"],
        "merged_model": ["grpo_adapter"],
        "evaluation_report": ["merged_model", "sft_dataset"],
        "gguf_export": ["merged_model", "evaluation_report"],
    }
    grpo = support.stage("grpo_adapter")
    assert [r.type for r in grpo.rewards] == ["numeric", "length"]
    assert (grpo.group_size, grpo.args.learning_rate, grpo.args.grad_accum) == (8, 2e-4, 1)  # YAML, then defaults
    assert support.model == "smollm2-135m" and support.source_file == str(BUNDLED)
    assert support.datasets["tickets"].path.endswith("example_data/tickets.csv")
    assert support.profile("quick")["sft_adapter"]["args"]["max_steps"] == 24
    assert support.feedback.evaluate.dataset == "sft_dataset" and support.feedback.sft.args.epochs == 2


def test_definitions_hold_the_support_assets_with_lineage():
    from dagster import AssetKey

    from dragon_dagster.definitions import defs

    graph = defs.resolve_asset_graph()
    key = lambda name: AssetKey(["support", name])  # noqa: E731
    assert {key(n) for n in ("tickets", "sft_dataset", "sft_adapter", "merged_model", "evaluation_report")} <= set(
        graph.get_all_asset_keys()
    )
    assert graph.get(key("sft_adapter")).parent_keys == {key("sft_dataset")}
    assert graph.get(key("preference_pairs")).parent_keys == {key("sft_dataset"), key("sft_adapter")}
    assert graph.get(key("dpo_adapter")).parent_keys == {key("preference_pairs"), key("sft_adapter")}
    assert graph.get(key("grpo_adapter")).parent_keys == {key("arithmetic_prompts"), key("dpo_adapter")}
    assert graph.get(key("merged_model")).parent_keys == {key("grpo_adapter")}
    assert graph.get(key("evaluation_report")).parent_keys == {key("merged_model"), key("sft_dataset")}
    # training-like assets share one concurrency pool so two never fight over a GPU
    pools = {k.path[-1]: graph.get(k).pools for k in graph.get_all_asset_keys() if k.path[0] == "support"}
    for name in ("sft_adapter", "preference_pairs", "dpo_adapter", "grpo_adapter", "merged_model", "evaluation_report"):
        assert pools[name] == {"training"}, name
    assert defs.resolve_job_def("support_pipeline") is not None


def test_the_launchpad_shows_each_stage_s_effective_values_nested_as_in_the_yaml():
    from dragon_dagster.definitions import defs

    job = defs.resolve_job_def("support_pipeline")

    def defaults(asset: str) -> dict:
        fields = job.graph.node_named(f"support__{asset}").definition.config_schema.config_type.fields
        return {name: field.default_value for name, field in fields.items() if field.default_provided}

    sft, grpo = defaults("sft_adapter"), defaults("grpo_adapter")
    assert sft["args"]["save_steps"] == 50 and sft["args"]["epochs"] == 3  # from the YAML
    assert sft["args"]["warmup_ratio"] == TrainArgs.model_fields["warmup_ratio"].default  # the kind's default
    assert sft["lora"] == {
        "r": 16,
        "alpha": 32,
        "dropout": 0.05,
        "use_dora": False,
        "use_rslora": False,
        "init": "gaussian",
        "loraplus_lr_ratio": None,
    }
    assert sft["resume"] is False
    assert grpo["group_size"] == 8 and grpo["kl_bound"] == GRPO.model_fields["kl_bound"].default
    assert grpo["args"]["learning_rate"] == 2e-4 and grpo["args"]["epochs"] == 1  # YAML; GRPO's own default
    dpo = defaults("dpo_adapter")  # the method is the stage's kind now (kind: dpo), not a per-run setting
    assert dpo["beta"] == 0.1 and "method" not in dpo
    assert defaults("sft_dataset") == {
        "eval_frac": 0.05,
        "seed": 42,
        "dedupe": "exact",
        "near_duplicates": {"find": True, "threshold": 0.8, "ngram": 3, "num_perm": 128},  # nested, per run too
        "allow_leakage": False,
        "layout": "auto",
        "stopping_strategy": "first_exhausted",  # a mixture's (sources:), per run too
        "mix_rows": None,
        "pii": "warn",  # the personal-data scan's mode, per run too
    }
    assert None not in (sft["n_samples"], sft["max_new_tokens"], grpo["temperature"])


def test_every_kind_is_registered_with_its_model_and_its_job_survives_a_round_trip(tmp_path):
    pipeline = load(write(tmp_path, EVERY_KIND))
    assert {s.kind for s in pipeline.stages} == set(KINDS)
    for stage in pipeline.stages:
        assert isinstance(stage, KINDS[stage.kind].settings)
        again = parse_stage(json.loads(json.dumps(stage.model_dump())))  # what job.json holds, read back
        assert again == stage and type(again) is type(stage)
        if KINDS[stage.kind].worker:
            job_class, run = KINDS[stage.kind].job_model(), KINDS[stage.kind].load_worker()
            assert job_class.model_fields["settings"] and callable(run)


@pytest.mark.parametrize("kind", sorted(BAD))
def test_a_bad_value_of_each_kind_names_the_file_the_line_and_the_field(tmp_path, kind):
    old, new, field = BAD[kind]
    assert EVERY_KIND.count(old) == 1
    text = EVERY_KIND.replace(old, new)
    path = write(tmp_path, text)
    with pytest.raises(PipelineError) as raised:
        load(path)
    message = str(raised.value)
    yaml_line = text.splitlines().index(next(line for line in text.splitlines() if new in line)) + 3  # + wrapper
    assert message.startswith(f"{path}: {field} (line {yaml_line}): "), message
    assert ";" not in message, f"one error, not a cascade: {message}"


@pytest.mark.parametrize(
    "yaml_text,message",
    [
        ("name: Bad Name\nstages: [{name: m, kind: merge}]", "name (line 1): String should match pattern"),
        ("name: x\nstages:\n  - {name: a, kind: teleport}", "stages[0] (line 3): Input tag 'teleport'"),
        ("name: x\nstages:\n  - {name: a, kind: sft, dataset: nowhere}", "names 'nowhere', which is not an earlier"),
        ("name: x\ndatasets: {d: {path: a.csv}}\nstages:\n  - {name: m, kind: merge}", "no training stage before"),
        ("name: x\nstages: []", "stages (line 2): List should have at least 1 item"),
        (
            "name: x\ndatasets: {d: {path: a.csv}}\nstages:\n  - {name: p, kind: pairs_dataset, source: d, prompt: q, "
            "chosen: c, rejected: r}\n  - {name: o, kind: preference, method: orpo, dataset: p}",
            "no training stage before it",
        ),
        ("name: x\nstages: [\n", "not valid YAML"),
        ("name: x\nmodle: y\nstages: [{name: m, kind: merge}]", "modle (line 2): unknown field"),
    ],
)
def test_malformed_pipelines_are_named(tmp_path, yaml_text, message):
    path = write(tmp_path, yaml_text, component=False)
    with pytest.raises(PipelineError, match=re.escape(message)) as raised:
        load(path)
    assert str(raised.value).startswith(str(path))


def test_numbers_written_the_yaml_1_1_way_are_numbers(tmp_path):
    text = EVERY_KIND.replace(
        "{name: sft, kind: sft, dataset: chat}",
        "{name: sft, kind: sft, dataset: chat, args: {learning_rate: 2e-4, epochs: 1e0}}",
    )
    sft = load(write(tmp_path, text)).stage("sft")
    assert sft.args.learning_rate == 2e-4 and sft.args.epochs == 1.0


def test_profiles_are_overlays_checked_by_the_stage_models(tmp_path):
    good = EVERY_KIND + "profiles:\n  quick:\n    sft: {args: {max_steps: 3}, n_samples: 1}\n"
    pipeline = load(write(tmp_path, good))
    assert pipeline.profile("quick") == {"sft": {"args": {"max_steps": 3}, "n_samples": 1}}
    with pytest.raises(PipelineError, match="profile 'quick', stage 'sft': args.max_steps: Input should be greater"):
        load(write(tmp_path, EVERY_KIND + "profiles:\n  quick:\n    sft: {args: {max_steps: 0}}\n"))
    with pytest.raises(PipelineError, match=r"\['dataset'\] cannot change per run"):
        load(write(tmp_path, EVERY_KIND + "profiles:\n  quick:\n    sft: {dataset: prompts}\n"))
    with pytest.raises(PipelineError, match="names 'sfx', which is not a stage"):
        load(write(tmp_path, EVERY_KIND + "profiles:\n  quick:\n    sfx: {n_samples: 1}\n"))


def test_the_json_schema_names_the_field_of_a_bad_stage_and_accepts_yaml_1_1_numbers():
    """What `dg check yaml` and editors validate against: per-kind if/then, not an opaque oneOf."""
    import yaml
    from jsonschema import Draft202012Validator

    validator = Draft202012Validator(Pipeline.model_json_schema())
    good = yaml.safe_load(EVERY_KIND.replace("dataset: chat}", "dataset: chat, args: {learning_rate: 2e-4}}", 1))
    assert list(validator.iter_errors(good)) == []
    bad = yaml.safe_load(
        EVERY_KIND.replace(
            "{name: sft, kind: sft, dataset: chat}", "{name: sft, kind: sft, dataset: chat, args: {batchsize: 2}}"
        )
    )
    [error] = list(validator.iter_errors(bad))
    assert list(error.absolute_path) == ["stages", 4, "args"] and "'batchsize' was unexpected" in error.message
    bad["stages"][4] = {"name": "sft", "kind": "sft", "dataset": "chat", "args": {"learning_rate": "abc"}}
    [error] = list(validator.iter_errors(bad))
    assert list(error.absolute_path) == ["stages", 4, "args", "learning_rate"]


def test_stage_defaults_live_in_the_stage_models_only():
    """The kinds differ only where their model says so: DPO and GRPO train gentler than SFT by default."""
    sft = SFT(name="a", kind="sft", dataset="d")
    dpo = DPO(name="b", kind="dpo", dataset="d")
    grpo = GRPO(name="c", kind="grpo", dataset="d", rewards=[{"type": "exact"}])
    assert (sft.args.learning_rate, dpo.args.learning_rate, grpo.args.learning_rate) == (2e-4, 5e-5, 1e-5)
    assert (sft.args.epochs, dpo.args.epochs, grpo.args.epochs) == (3, 2, 1)
    assert (dpo.kind, dpo.beta, grpo.group_size, grpo.beta) == ("dpo", 0.1, 4, 0.04)
    with pytest.raises(ValueError, match="unknown reward type 'magic'"):
        GRPO(name="c", kind="grpo", dataset="d", rewards=[{"type": "magic"}])
    source = "".join(p.read_text() for p in Path(dragon_dagster.__file__).parent.rglob("*.py"))
    assert source.count("group_size: int = Field(4") == 1 and "STAGE_DEFAULTS" not in source
