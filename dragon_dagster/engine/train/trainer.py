"""What every trainer stage shares: the rows and the starting model, LoRA, progress, NaN and cancel handling.

Each training kind (stages/sft, stages/dpo, stages/grpo, ...) builds its TRL config (its trl_config.py, on
train/trl_config.py), its trainer, and summarizes it; the rest lives here.
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..artifacts import progress
from ..artifacts.checkpoints import checkpoint_problem, last_checkpoint
from ..config.hardware import Hardware, Speed
from ..config.job import Job, TrainingInputs
from ..config.reporter import Reporter, StepProgress
from ..config.training import Lora, TrainArgs
from ..data.tables import read_jsonl
from ..models import load_model, load_tokenizer, pick_device
from . import distributed, held_out
from .stage import TrainerStage
from .variants import save_adapter, save_initial, use_loraplus

TrainingJob = Job[TrainerStage, TrainingInputs]  # what every training kind's worker receives (its own settings)


@dataclass
class Prepared:
    lora: Lora
    args: TrainArgs
    hardware: Hardware
    speed: Speed  # resolved for the device: no "auto" left
    train_rows: list[dict]
    eval_rows: list[dict]
    tokenizer: object
    model: object
    workers: int = 1  # data-parallel ranks sharing args.batch_size (the global batch)
    rendering: str = "none"  # how the chat template renders the rows (tools/template.py): native, fallback, none
    eval_total: int = 0  # the held-out split's rows, of which eval_rows is the seeded sample (args.max_eval_rows)
    # the training rows the trainer is given, where a kind sets them (rows_for_steps: those max_steps reaches);
    # train_rows stays the whole split, which the result's figures describe
    reached_rows: list[dict] | None = None

    @property
    def trained_rows(self) -> list[dict]:
        return self.train_rows if self.reached_rows is None else self.reached_rows


def prepare(job: TrainingJob, template: Callable[[object, list[dict]], str] | None = None) -> Prepared:
    """Read the rows, load the starting model with earlier adapters folded in; speed resolved for the device.

    template(tokenizer, rows) readies the tokenizer's chat template for the rows (train and held-out) in place
    and says which rendering it is; it runs before the model loads, so a template that cannot do what the
    stage asks fails in seconds."""
    lora, args, inputs = job.settings.lora, job.settings.args, job.inputs
    hardware = job.hardware
    check_lora_device(lora, pick_device(hardware))
    speed = (job.speed or Speed()).resolve(pick_device(hardware))
    train_rows = read_jsonl(inputs.train_file)
    eval_rows = read_jsonl(inputs.eval_file) if inputs.eval_file and Path(inputs.eval_file).exists() else []
    eval_total = len(eval_rows)
    eval_rows = held_out.sample_rows(eval_rows, args.max_eval_rows, args.seed)
    if not train_rows:
        raise TrainingError(f"no training rows in {inputs.train_file}")
    tokenizer = load_tokenizer(inputs.model)
    rendering = template(tokenizer, train_rows + eval_rows) if template else "none"
    distributed.bind_device()
    model = load_model(inputs.model, hardware, adapters=inputs.adapters, trainable=True)
    return Prepared(
        lora,
        args,
        hardware,
        speed,
        train_rows,
        eval_rows,
        tokenizer,
        model,
        distributed.world_size(),
        rendering,
        eval_total,
    )


def rows_for_steps(rows: list[dict], args: TrainArgs, reporter: Reporter) -> list[dict]:
    """The training rows max_steps reaches, for a kind whose update takes batch_size x grad_accum rows (the global
    batch, however many workers share it): with max_steps set and more rows than max_steps x that, a sample of
    that many drawn with the seed, in the split's order. The trainer's shuffled sampler would have drawn a
    uniform subset of that size too; what changes is that TRL then prepares (tokenizes, truncates) only those
    rows, not every row of a 100,000-row dataset for a few steps. Every row otherwise (epochs, a small dataset)."""
    if args.max_steps is None:
        return rows
    needed = args.max_steps * args.batch_size * args.grad_accum
    if len(rows) <= needed:
        return rows
    reporter.log(
        f"max_steps {args.max_steps} x batch_size {args.batch_size} x grad_accum {args.grad_accum} reach "
        f"{needed} of the {len(rows)} training rows: a sample of {needed} drawn with the seed is prepared and trained"
    )
    return held_out.sample_rows(rows, needed, args.seed)


def apply_speed(trainer, speed: Speed, chunked: bool, reporter: Reporter) -> dict:
    """The speed choices that act on the trainer's (PEFT-wrapped) model; returns what was used, for the manifest.

    Unpadding needs the chunked head: it is what runs the backbone itself, over the real tokens.
    """
    from . import unpadded
    from .dropout import use_fast_dropout
    from .lora_products import use_lora_products

    # DoRA's layers run PEFT's own forward (its magnitude scales base and product together): no accumulated product
    dora = any(getattr(c, "use_dora", False) for c in getattr(trainer.model, "peft_config", {}).values())
    used = {
        "loss_kernel": "chunked" if chunked else "trl",
        "unpad": speed.unpad == "on" and chunked,
        "dropout_mask": speed.dropout_mask,
        "lora_product": "peft (DoRA)" if dora and speed.lora_product == "accumulated" else speed.lora_product,
    }
    if used["unpad"]:
        unpadded.use(trainer.model)
    if speed.dropout_mask == "fast":
        used["fast_dropouts"] = use_fast_dropout(trainer.model)
    if used["lora_product"] == "accumulated":
        used["accumulated_lora_layers"] = use_lora_products(trainer.model)
    reporter.log("speed: " + ", ".join(f"{k} {v}" for k, v in used.items()))
    return used


def run_trainer(trainer, callback, job: TrainingJob, reporter: Reporter):
    """Train (resuming when asked), stop cleanly on NaN or cancel, save the adapter; returns TrainOutput.

    With several workers every rank trains and stops alike; rank 0 alone writes the progress and the adapter.
    The LoRA variants that act on the trainer rather than on the adapter's config are set here (variants.py):
    LoRA+'s optimizer, and a PiSSA/OLoRA adapter saved converted to a plain one on the untouched base.
    """
    lora = job.settings.lora
    if use_loraplus(trainer, lora):
        reporter.log(f"LoRA+: the B matrices learn at {lora.loraplus_lr_ratio} x the learning rate")
    with tempfile.TemporaryDirectory(prefix="dragon-initial-adapter-") as scratch:
        initial = save_initial(trainer.model, lora, Path(scratch)) if distributed.is_main() else None
        return train_and_save(trainer, callback, job, reporter, initial)


def train_and_save(trainer, callback, job: TrainingJob, reporter: Reporter, initial: str | None):
    quiet_progress_bar(trainer)
    resume_from = resume_point(job.inputs.resume_from, reporter)
    if resume_from:
        carry_history(trainer, callback, resume_from, Path(job.output_dir), reporter)
    reporter.log(
        f"training {len(trainer.train_dataset)} rows for "
        f"{trainer.args.max_steps if trainer.args.max_steps > 0 else trainer.args.num_train_epochs} "
        f"{'steps' if trainer.args.max_steps > 0 else 'epochs'} on {trainer.model.device}"
        + (f", resuming from {resume_from}" if resume_from else "")
    )
    result = trainer.train(resume_from_checkpoint=resume_from)
    distributed.check_in_sync(trainer.model, reporter.log)
    finish_training(trainer, callback, job.inputs.checkpoint_dir, reporter)
    if not distributed.is_main():
        return result
    adapter_dir = Path(job.output_dir) / "adapter"
    save_adapter(trainer.model, adapter_dir, initial)
    if initial:
        reporter.log(f"adapter ({job.settings.lora.init} init) saved as a plain LoRA on the untouched base")
    trainer.processing_class.save_pretrained(adapter_dir)
    return result


class TrainingError(RuntimeError):
    """Training could not go on: NaN loss, no data, a broken model."""


class Cancelled(RuntimeError):
    """Training stopped on request after saving a checkpoint."""


def resume_point(resume_from: str | None, reporter: Reporter) -> str | None:
    """The checkpoint to resume from: resume_from when it is complete, else the newest complete one beside it
    (a kill can leave the newest checkpoint half-saved); TrainingError when there is none."""
    if not resume_from:
        return None
    problem = checkpoint_problem(resume_from)
    if problem is None:
        return resume_from
    reporter.log(f"checkpoint {resume_from} is incomplete ({problem}); looking for an earlier complete one")
    found = last_checkpoint(Path(resume_from).parent, log=reporter.log)
    if found is None:
        raise TrainingError(
            f"cannot resume: checkpoint {resume_from} is incomplete ({problem}) and no complete "
            f"checkpoint is beside it in {Path(resume_from).parent}"
        )
    reporter.log(f"resuming from {found} instead")
    return str(found)


def planned_steps(trainer) -> int:
    """The optimizer steps this trainer will run in all: max_steps, or what its epochs come to."""
    if trainer.args.max_steps > 0:
        return trainer.args.max_steps
    return trainer.set_initial_training_values(trainer.args, trainer.get_train_dataloader())[-1]


def carry_history(trainer, callback, checkpoint: str, out_dir: Path, reporter: Reporter) -> None:
    """Before resuming: refuse a changed length, then start out_dir's progress.jsonl with the rows the earlier
    run logged up to the checkpoint (its trainer_state.json log_history), so the curve, first_loss and the
    loss check cover the whole training, not only the resumed steps."""
    state = json.loads((Path(checkpoint) / "trainer_state.json").read_text())
    before, now = state.get("max_steps"), planned_steps(trainer)
    if before and before > 0 and now != before:
        asked = (
            f"max_steps {now}"
            if trainer.args.max_steps > 0
            else f"{trainer.args.num_train_epochs} epochs ({now} steps)"
        )
        raise TrainingError(
            f"cannot resume from {checkpoint}: it was trained for max_steps {before}, this run asks for {asked}; "
            f"the learning-rate schedule (warmup and decay over max_steps) would jump from the old one to the new "
            f"one at step {state.get('global_step')}. Resume with the same max_steps/epochs ({before} steps), "
            f"or train afresh with resume: false"
        )
    step = state.get("global_step", 0)
    rows = [
        progress_row(entry["step"], {k: v for k, v in entry.items() if k != "step"}, callback.columns)
        for entry in state.get("log_history", [])
        if isinstance(entry.get("step"), int) and entry["step"] <= step and "train_runtime" not in entry
    ]
    if not distributed.is_main():
        return
    progress.write(out_dir, rows)  # replaces rows a stopped run left in out_dir: history, then the resumed steps
    reporter.log(f"progress: {len(rows)} rows logged before step {step} carried over from {checkpoint}")


def lora_config(lora: Lora, task_type: str = "CAUSAL_LM", modules_to_save: list[str] | None = None):
    """The adapter's PEFT config, its variant included (DoRA, rsLoRA, the init). A reward model passes SEQ_CLS and
    its new `score` head, trained in full and saved with the adapter (modules_to_save)."""
    from peft import LoftQConfig, LoraConfig

    return LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.peft_target_modules(),
        task_type=task_type,
        modules_to_save=modules_to_save,
        use_dora=lora.use_dora,
        use_rslora=lora.use_rslora,
        init_lora_weights=lora.peft_init(),
        loftq_config=LoftQConfig(loftq_bits=4) if lora.init == "loftq" else {},
    )


def check_lora_device(lora: Lora, device: str) -> None:
    """Refuse, before the model loads, a LoRA init the device cannot run."""
    if lora.init != "loftq":
        return
    if device != "cuda":
        raise TrainingError(
            f"lora.init loftq needs a CUDA GPU and this job runs on {device}: LoftQ quantizes each weight to 4 bits "
            "with bitsandbytes on CUDA (peft.utils.loftq_utils) to start the adapter from the quantization error. "
            "Use init pissa or olora on this device, or run the stage on a GPU"
        )
    from peft.import_utils import is_bnb_4bit_available

    if not is_bnb_4bit_available():
        raise TrainingError(
            "lora.init loftq needs bitsandbytes (4-bit quantization), which is not installed here: install it, "
            "or use init pissa or olora"
        )


def progress_row(
    step: int, logs: dict, columns: dict | None, elapsed: float | None = None, eta: float | None = None
) -> dict:
    """One progress.jsonl row from a trainer log dict (also from a checkpoint's log_history entry)."""
    row = {
        "step": step,
        "epoch": logs.get("epoch"),
        "loss": logs.get("loss"),
        "lr": logs.get("learning_rate"),
        "grad_norm": logs.get("grad_norm"),
        "elapsed_s": None if elapsed is None else round(elapsed, 2),
        "eta_s": None if eta is None else round(eta, 1),
    }
    row.update(
        {
            (columns or {}).get(k, k): v
            for k, v in logs.items()
            if k not in ("loss", "learning_rate", "grad_norm", "epoch") and isinstance(v, (int, float))
        }
    )
    return row


def progress_callback(reporter: Reporter, out_dir: Path, prefix: str = "train", columns: dict | None = None):
    """A TrainerCallback that streams step metrics, stops on NaN loss and honours cancel requests.

    columns renames trainer log keys into progress columns (GRPO's rewards/<name>/mean -> reward_<name>).
    """
    from transformers import TrainerCallback

    class ProgressCallback(TrainerCallback):
        def __init__(self):
            self.started = time.time()
            self.columns = columns
            self.first_step = 0  # a resumed run starts past 0: its ETA counts only its own steps
            self.nan_step: int | None = None
            self.cancelled = False

        def on_log(self, args, state, control, logs=None, **kwargs):
            logs = dict(logs or {})  # the same on every rank: the trainer averages the loss across ranks
            loss = logs.get("loss")
            # logging_nan_inf_filter is off, so a NaN loss shows here; a NaN gradient norm is the same failure.
            if any(v is not None and not math.isfinite(v) for v in (loss, logs.get("grad_norm"))):
                self.nan_step = state.global_step
                control.should_training_stop = True
            elapsed = time.time() - self.started
            done = max(state.global_step - self.first_step, 1)
            eta = elapsed / done * max(state.max_steps - state.global_step, 0)
            if not state.is_world_process_zero:  # rank 0 writes and reports for all
                return
            progress.append(out_dir, progress_row(state.global_step, logs, columns, elapsed, eta))
            # an evaluation's figures go as train/eval_loss, ...: the held-out curve beside train/loss, on the same
            # step axis (heldout/ is the report's, by place in the chain; eval/ each kind's final figures)
            metrics = {f"{prefix}/{k}": v for k, v in logs.items() if isinstance(v, (int, float))}
            reporter.metrics(state.global_step, metrics)
            shown = ", ".join(f"{k} {v:.4g}" for k, v in logs.items() if isinstance(v, (int, float)) and k != "epoch")
            line = f"step {state.global_step}/{state.max_steps} {shown} | elapsed {elapsed:.0f}s eta {eta:.0f}s"
            reporter.step(StepProgress(state.global_step, state.max_steps, line))

        def on_train_begin(self, args, state, control, **kwargs):
            self.first_step = state.global_step

        def on_step_end(self, args, state, control, **kwargs):
            if distributed.agree(reporter.should_stop()):  # every rank stops after the same step
                self.cancelled = True
                control.should_save = True
                control.should_training_stop = True

    return ProgressCallback()


def quiet_progress_bar(trainer) -> None:
    """Keep transformers' tqdm bar but drop its printed log dicts: our callback reports each step once. No bar
    at all where the libraries' bars are off (huggingface_hub's switch, which the worker turns off where the
    launcher's terminal draws its own: runtime/library_noise.py)."""
    from huggingface_hub.utils import are_progress_bars_disabled
    from transformers.trainer_callback import ProgressCallback

    class BarOnly(ProgressCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            pass

    if trainer.pop_callback(ProgressCallback) is not None and not are_progress_bars_disabled():
        trainer.add_callback(BarOnly())


def finish_training(trainer, callback, checkpoint_dir: str, reporter: Reporter) -> None:
    """Raise for a NaN loss or a cancel; both keep the checkpoints already on disk."""
    if callback.nan_step is not None:
        raise TrainingError(
            f"loss became NaN or infinite at step {callback.nan_step}: lower the learning rate "
            f"or check the data; checkpoints so far are kept in {checkpoint_dir}"
        )
    if callback.cancelled:
        ckpt = last_checkpoint(checkpoint_dir)
        reporter.log(f"cancelled: checkpoint saved at {ckpt}; materialize again with resume: true to continue")
        raise Cancelled(f"training cancelled at step {trainer.state.global_step}; checkpoint {ckpt}")
