"""PEFT's LoRA variants around a built trainer, the same for every kind: LoRA+'s optimizer, and the initial
adapter of a base-changing init (PiSSA, OLoRA) that the trained one is converted against at save.

PiSSA and OLoRA move the top of each adapted weight into the adapter (W = W_res + B0 A0) and train on W_res, so
neither the trained adapter alone nor the adapter-off model means anything on the untouched base. PEFT converts
at save (save_pretrained's path_initial_model_for_weight_conversion): the saved adapter is B A - B0 A0, a plain
LoRA of twice the rank on the untouched base, which merge, GGUF export and chat load like any other. It needs the
initial adapter, saved before training with init_lora_weights set to True (else loading it would decompose the
residual again).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from ..config.training import Lora


def use_loraplus(trainer, lora: Lora) -> bool:
    """Give trainer the LoRA+ optimizer (each B matrix's learning rate lora.loraplus_lr_ratio times A's) when asked.

    The trainer's own optimizer choice (its optim and betas: get_optimizer_cls_and_kwargs) stays; only the
    parameter groups are LoRA+'s. Set before train(), the trainer takes it as given (create_optimizer keeps an
    existing optimizer), builds its schedule on it and restores its state when resuming."""
    if lora.loraplus_lr_ratio is None:
        return False
    from peft.optimizers import create_loraplus_optimizer

    optimizer_cls, kwargs = trainer.get_optimizer_cls_and_kwargs(trainer.args, trainer.model)
    kwargs = {k: v for k, v in kwargs.items() if k != "lr"}
    trainer.optimizer = create_loraplus_optimizer(
        trainer.model,
        optimizer_cls,
        lr=trainer.args.learning_rate,
        loraplus_lr_ratio=lora.loraplus_lr_ratio,
        loraplus_weight_decay=trainer.args.weight_decay,
        **kwargs,
    )
    return True


def save_initial(model, lora: Lora, scratch: Path) -> str | None:
    """Save the adapter as initialised (before any step) under scratch when the init changes the base; its path,
    for save_adapter. None when nothing needs converting."""
    if not lora.changes_base():
        return None
    config = model.peft_config["default"]
    init = config.init_lora_weights
    config.init_lora_weights = True  # loading it back must not decompose the (residual) base again
    try:
        path = scratch / "initial_adapter"
        model.save_pretrained(path)
    finally:
        config.init_lora_weights = init
    return str(path)


def save_adapter(model, adapter_dir: Path, initial: str | None) -> None:
    """Save the trained adapter; converted to a plain LoRA on the untouched base when initial is given."""
    model.save_pretrained(adapter_dir, path_initial_model_for_weight_conversion=initial)


def as_started(model, lora: Lora):
    """A context in which model (PEFT-wrapped, before training) is the model the stage starts from: its adapter
    off, as usual; with a base-changing init, on (W_res + B0 A0 is the start; the adapter-off W_res is not)."""
    return contextlib.nullcontext() if lora.changes_base() else model.disable_adapter()
