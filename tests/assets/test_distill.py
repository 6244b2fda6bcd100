"""On-policy distillation through Dagster on the tiny model: a teacher that is an earlier stage (an SFT adapter,
its asset an input of the distill asset: a lineage edge) distilled into a fresh adapter, then a teacher that is a
registered model (models:/name@alias, resolved by the step to the version it names), with the held-out figures
each stage reports; and a teacher whose tokenizer is another refused when the pipeline loads, with the reason."""

from __future__ import annotations

import json
import shutil
import signal
import textwrap
from pathlib import Path

import pytest

ROWS = "".join(f"What is {a} + {b}?,{a} plus {b} makes {a + b}.\n" for a in range(1, 13) for b in (2, 3, 4))


@pytest.fixture(autouse=True)
def signal_handlers_kept():
    """The in-process Dagster run leaves SIGTERM mapped to KeyboardInterrupt; later tests signal this process."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for number, handler in handlers.items():
        signal.signal(number, handler)


def write_pipeline(folder: Path, model: Path, teacher_model: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sums.csv").write_text("q,a\n" + ROWS)
    args = "{max_steps: 3, batch_size: 2, grad_accum: 1, logging_steps: 1, save_steps: 50, max_seq_len: 96}"
    (folder / "defs.yaml").write_text(
        textwrap.dedent(f"""\
        type: dragon_dagster.PostTrainingPipeline
        attributes:
          name: distill_tiny
          model: {model}
          datasets:
            sums: {{path: sums.csv}}
          stages:
            - {{name: chat, kind: chat_dataset, source: sums, prompt: q, response: a, eval_frac: 0.25}}
            - {{name: sft_adapter, kind: sft, dataset: chat, n_samples: 1,
                args: {{max_steps: 6, batch_size: 4, grad_accum: 1, logging_steps: 2, save_steps: 50,
                        learning_rate: 5.0e-3, max_seq_len: 96}}}}
            - {{name: from_stage, kind: distill, dataset: chat, teacher: {{stage: sft_adapter}}, student: base,
                beta: 0.5, max_new_tokens: 8, max_eval_prompts: 4, n_samples: 2,
                args: {{max_steps: 3, batch_size: 2, grad_accum: 1, logging_steps: 1, save_steps: 50,
                        learning_rate: 5.0e-3, max_seq_len: 96}}}}
            - {{name: from_registry, kind: distill, dataset: chat, teacher: {{model: "{teacher_model}"}},
                max_new_tokens: 8, max_eval_prompts: 4, args: {args}}}
            - {{name: merged_model, kind: merge}}
        """)
    )
    return folder / "defs.yaml"


def test_distill_from_an_earlier_stage_and_from_a_registered_model(tiny_model, tmp_path, resources_for):
    from dagster import AssetKey, DagsterInstance, Definitions

    from dragon_dagster.assets.factory import build_pipeline_defs
    from dragon_dagster.assets.launch import materialize_pipeline
    from dragon_dagster.engine.models import build_tiny_model
    from dragon_dagster.engine.pipeline import load

    runs = tmp_path / "runs"
    resources = resources_for(runs)
    tracking = resources["tracking"]
    # the registered teacher: another tiny model with the same tokenizer, promoted to an alias
    teacher_dir = build_tiny_model(tmp_path / "teacher", seed=7)
    version = tracking.register_model("tiny_teacher", teacher_dir, None, {"source": "test"})
    tracking.client().set_registered_model_alias("tiny_teacher", "champion", version)

    pipeline = load(write_pipeline(tmp_path / "defs" / "distill_tiny", tiny_model, "models:/tiny_teacher@champion"))
    graph = Definitions(assets=build_pipeline_defs(pipeline)["assets"], resources=resources).resolve_asset_graph()
    # the teacher stage is an input of the distill asset; a fresh student continues from no adapter
    assert graph.get(AssetKey(["distill_tiny", "from_stage"])).parent_keys == {
        AssetKey(["distill_tiny", "chat"]),
        AssetKey(["distill_tiny", "sft_adapter"]),
    }
    assert pipeline.previous("from_stage") is None and pipeline.previous("from_registry") == "from_stage"

    outcome = materialize_pipeline(pipeline, resources=resources, instance=DagsterInstance.ephemeral())
    assert outcome["success"], outcome["stages"]
    sft_dir = Path(outcome["artifacts"]["sft_adapter"])

    stage_dir = Path(outcome["artifacts"]["from_stage"])
    manifest = json.loads((stage_dir / "manifest.json").read_text())
    job = json.loads((stage_dir / "job.json").read_text())
    assert manifest["method"] == "distill" and manifest["chain"] == [str(stage_dir / "adapter")]  # a fresh adapter
    assert job["inputs"]["declared"] == [{"role": "teacher", "stage": "sft_adapter", "path": str(sft_dir)}]
    result = manifest["result"]
    assert result["teacher"] == "stage sft_adapter" and result["beta"] == 0.5
    assert result["eval_rows"] == 4
    for figures in ("student_before", "student_after", "teacher_figures"):
        assert result[figures]["nll"] > 0 and "token_f1" in result[figures]["metrics"]
    # the SFT teacher knows the replies far better than the untrained base the student starts from
    assert result["teacher_figures"]["nll"] < result["student_before"]["nll"]
    assert result["divergence_before"] > 0 and result["divergence_after"] > 0
    assert result["student_after"]["nll"] != result["student_before"]["nll"]  # the adapter trained
    samples = [json.loads(line) for line in (stage_dir / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 2 and {"prompt", "before", "after"} <= set(samples[0])
    run = tracking.client().get_run(manifest["mlflow_run_id"])
    assert run.data.tags["method"] == "distill"
    assert {"eval/loss", "eval/loss_before", "eval/teacher_loss", "eval/divergence"} <= set(run.data.metrics)
    checks = {c["name"]: c for c in outcome["checks"] if c["asset"] == "distill_tiny/from_stage"}
    assert {"losses_finite_and_falling", "student_closer_to_teacher"} <= set(checks)

    registry_dir = Path(outcome["artifacts"]["from_registry"])
    manifest = json.loads((registry_dir / "manifest.json").read_text())
    job = json.loads((registry_dir / "job.json").read_text())
    (referenced,) = job["inputs"]["referenced"]
    assert referenced["role"] == "teacher" and referenced["spec"] == "models:/tiny_teacher@champion"
    assert referenced["version"] == version and (Path(referenced["path"]) / "config.json").exists()
    assert manifest["chain"] == [str(stage_dir / "adapter"), str(registry_dir / "adapter")]  # student: chain
    assert manifest["result"]["teacher"] == f"models:/tiny_teacher@champion (version {version})"
    run = tracking.client().get_run(manifest["mlflow_run_id"])
    assert run.data.tags["teacher.model"] == f"models:/tiny_teacher@champion (version {version})"


def write_teacher_with_another_tokenizer(tiny_model: Path, folder: Path) -> Path:
    """The tiny model's weights beside a word-level tokenizer of its own: the same shapes, other token ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    shutil.copytree(tiny_model, folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt"):
        (folder / name).unlink(missing_ok=True)
    words = {w: i for i, w in enumerate(["<unk>", "<pad>", "what", "is", "plus", "makes"])}
    tokenizer = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", pad_token="<pad>").save_pretrained(folder)
    return folder


def test_a_teacher_with_another_tokenizer_is_refused_when_the_pipeline_loads(tiny_model, tmp_path):
    from dragon_dagster.engine.pipeline import PipelineError, load

    other = write_teacher_with_another_tokenizer(tiny_model, tmp_path / "other")
    with pytest.raises(PipelineError) as refused:
        load(write_pipeline(tmp_path / "defs" / "distill_tiny", tiny_model, str(other)))
    message = str(refused.value)
    assert "from_registry" in message and "does not share the student's tokenizer" in message
    assert "the teacher's tokenizer has 6 tokens, the student's 49,152" in message


def test_a_teacher_stage_must_have_a_model_and_not_be_the_students_start(tiny_model, tmp_path):
    from dragon_dagster.engine.pipeline import PipelineError, load

    path = write_pipeline(tmp_path / "defs" / "distill_tiny", tiny_model, "models:/x@champion")
    text = path.read_text()
    path.write_text(text.replace("teacher: {stage: sft_adapter}, student: base", "teacher: {stage: sft_adapter}"))
    with pytest.raises(PipelineError, match="is the model the student starts from"):
        load(path)
    path.write_text(text.replace("teacher: {stage: sft_adapter}", "teacher: {stage: chat}"))
    with pytest.raises(PipelineError, match="teacher stage 'chat' is a chat_dataset stage, which has no model"):
        load(path)
    path.write_text(text.replace("teacher: {stage: sft_adapter}", "teacher: {stage: sft_adapter, model: x}"))
    with pytest.raises(PipelineError, match="give exactly one of `stage`"):
        load(path)
    path.write_text(text.replace("student: base,", "student: base, lmbda: 0.5,"))
    with pytest.raises(PipelineError, match="lmbda .* is not a setting of TRL 1.16's DistillationTrainer"):
        load(path)
