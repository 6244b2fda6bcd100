"""The framework-free engine on its own: loss masking, NaN handling, cancel and resume, merging."""

import json
import subprocess
import sys

import pytest

from dragon_dagster.engine import models
from dragon_dagster.engine.artifacts.checkpoints import last_checkpoint
from dragon_dagster.engine.artifacts.manifest import AdapterManifest, write_manifest
from dragon_dagster.engine.config.hardware import Hardware
from dragon_dagster.engine.config.job import ModelInputs
from dragon_dagster.engine.config.reporter import Reporter
from dragon_dagster.engine.data import row_parts, tables
from dragon_dagster.engine.stages.merge.settings import Merge
from dragon_dagster.engine.stages.merge.worker import MergeJob, merge_chain
from dragon_dagster.engine.stages.sft.result import SFTResult
from dragon_dagster.engine.stages.sft.worker import train_sft
from dragon_dagster.engine.train.trainer import Cancelled, TrainingError
from tests.support import Recorded, ticket_files
from tests.support import sft_job as job

ENGINE_MODULES = (
    "dragon_dagster.engine.stages.sft.worker",
    "dragon_dagster.engine.runtime.worker",
    "dragon_dagster.engine.stages.evaluate.worker",
    "dragon_dagster.engine.stages.merge.worker",
    "dragon_dagster.engine.runs",
    "dragon_dagster.engine.catalog",
    "dragon_dagster.engine.pipeline",
)


def test_engine_imports_no_dagster():
    code = (
        f"import sys; import {', '.join(ENGINE_MODULES)}; "
        "bad = [m for m in sys.modules if m == 'dagster' or m.startswith('dagster.')]; print(bad); assert not bad"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_loss_is_only_on_the_assistant_reply(tiny_model, tmp_path):
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    train, _ = ticket_files(tmp_path, n=8)
    rows = tables.read_jsonl(train)
    tokenizer = models.load_tokenizer(str(tiny_model))
    trainer = SFTTrainer(
        model=str(tiny_model),
        processing_class=tokenizer,
        train_dataset=Dataset.from_list(rows),
        args=SFTConfig(
            output_dir=str(tmp_path / "o"), use_cpu=True, bf16=False, report_to="none", completion_only_loss=True
        ),
    )
    example = trainer.train_dataset[0]  # TRL turns the completion mask into labels (-100: no loss)
    ids, labels = example["input_ids"], example["labels"]
    trained = tokenizer.decode([i for i, label in zip(ids, labels) if label != -100])
    context = tokenizer.decode([i for i, label in zip(ids, labels) if label == -100])
    assert trained.startswith(row_parts.reply_text(rows[0])) and trained.rstrip().endswith("<|im_end|>")
    assert row_parts.user_text(rows[0]) in context and row_parts.reply_text(rows[0]) not in context


def test_sft_trains_saves_an_adapter_and_evaluates(tiny_model, tmp_path):
    train, held = ticket_files(tmp_path)
    reporter = Recorded()
    result = train_sft(job(tmp_path, tiny_model, train, held), reporter)
    out = tmp_path / "out"
    assert (out / "adapter" / "adapter_config.json").exists()
    assert result.global_step == 4 and result.held_out and result.eval_tokens > 0
    # 4 steps of 2 rows reach 8 of the ~190 training rows: the trainer is given (and tokenizes) only those
    assert any(line.startswith("training 8 rows for 4 steps") for line in reporter.lines), reporter.lines
    assert result.last_loss < result.first_loss
    assert len((out / "samples.jsonl").read_text().splitlines()) == 2
    assert (out / "loss.png").stat().st_size > 1000
    assert json.loads((out / "metrics.json").read_text())["perplexity"] == pytest.approx(
        2.718281828**result.eval_loss, rel=1e-6
    )


def test_nan_loss_stops_with_a_clear_error_and_keeps_checkpoints(tiny_model, tmp_path):
    train, held = ticket_files(tmp_path)
    with pytest.raises(TrainingError, match="NaN"):
        train_sft(job(tmp_path, tiny_model, train, held, learning_rate=1e38, max_steps=6, save_steps=1), Reporter())
    assert last_checkpoint(tmp_path / "ckpt") is not None


class StopAfter(Reporter):
    def __init__(self, step):
        super().__init__()
        self.stop_at, self.seen = step, 0

    def metrics(self, step, values):
        self.seen = max(self.seen, step)

    def should_stop(self):
        return self.seen >= self.stop_at


def test_cancel_saves_a_checkpoint_and_resume_continues_from_it(tiny_model, tmp_path):
    train, held = ticket_files(tmp_path)
    with pytest.raises(Cancelled):
        train_sft(job(tmp_path, tiny_model, train, held, max_steps=8, save_steps=100), StopAfter(3))
    checkpoint = last_checkpoint(tmp_path / "ckpt")
    stopped_at = int(checkpoint.name.split("-")[1])
    assert 3 <= stopped_at < 8  # saved where it stopped, although save_steps is 100
    assert not (tmp_path / "out" / "adapter").exists()
    resumed = job(tmp_path, tiny_model, train, held, max_steps=8, save_steps=100)
    resumed.inputs.resume_from = str(checkpoint)
    (tmp_path / "out" / "progress.jsonl").unlink()
    result = train_sft(resumed, Reporter())
    rows = [json.loads(line) for line in (tmp_path / "out" / "progress.jsonl").read_text().splitlines()]
    carried = [r["step"] for r in rows if r["elapsed_s"] is None]  # the history before the checkpoint
    trained = [r["step"] for r in rows if r["elapsed_s"] is not None]
    assert result.global_step == 8 and min(trained) > stopped_at  # picked up where it stopped
    assert carried[0] == 1 and max(carried) <= stopped_at  # and the progress keeps the whole run


def test_merge_folds_the_adapter_into_a_plain_transformers_model(tiny_model, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    train, held = ticket_files(tmp_path)
    sft = job(tmp_path, tiny_model, train, held)
    adapter = str(tmp_path / "out" / "adapter")
    write_manifest(  # the merge reads the adapter's manifest beside it (for the model card), as a pipeline writes it
        tmp_path / "out",
        AdapterManifest[SFTResult](
            stage=sft.settings.name,
            method=sft.settings.objective(),
            base_model=str(tiny_model),
            resolved_model=str(tiny_model),
            chain=[adapter],
            dataset=str(tmp_path / "dataset"),
            settings=sft.settings.model_dump(),
            result=train_sft(sft, Reporter()),
        ),
    )
    merged = tmp_path / "merged"
    merged.mkdir()
    info = merge_chain(
        MergeJob(
            settings=Merge(name="merged_model", kind="merge"),
            inputs=ModelInputs(model=str(tiny_model), adapters=[adapter]),
            output_dir=str(merged),
            hardware=Hardware(device="cpu"),
        ),
        Reporter(),
    )
    plain = AutoModelForCausalLM.from_pretrained(merged / "model")
    with_adapter = models.load_model(str(tiny_model), models.Hardware(device="cpu"), adapters=[adapter])
    ids = torch.tensor([[1, 2, 3, 4]])
    assert torch.allclose(plain(ids).logits, with_adapter(ids).logits, atol=1e-4)
    base = models.load_model(str(tiny_model), models.Hardware(device="cpu"))
    assert not torch.allclose(plain(ids).logits, base(ids).logits, atol=1e-4)
    assert info.parameters == sum(p.numel() for p in plain.parameters())
