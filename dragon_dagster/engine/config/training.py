"""What every LoRA training stage is given: the adapter's shape (dragon_lora) and the trainer arguments
(dragon_train_args). A kind changes the defaults by subclassing TrainArgs (train/reinforce/settings.py, say)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from .settings import Settings

# transformers' optimizers that need nothing beyond torch (the 8-bit and paged ones need bitsandbytes and a CUDA
# GPU, GaLore, APOLLO and the schedule-free ones packages of their own: none is installed with this project).
Optimizer = Literal["adamw_torch_fused", "adamw_torch", "adafactor", "sgd", "adagrad", "rmsprop"]
# transformers' schedules that need no arguments beyond warmup (reduce_lr_on_plateau needs an evaluation metric
# each step, the *_min_lr and warmup_stable_decay ones lr_scheduler_kwargs).
Schedule = Literal[
    "linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup", "inverse_sqrt"
]

# Held-out rows scored at each evaluation and after training, by default. 200 rows put the standard error of a
# mean held-out loss near 7% of the rows' spread (1/sqrt(200)), enough to see a turn in the curve, while an
# evaluation stays a few seconds where the whole split of a large dataset took minutes (10,000 rows: 125 s).
MAX_EVAL_ROWS = 200

# PiSSA's exact SVD of every adapted weight is the slow part of its init on a CPU; PEFT's randomized SVD
# (pissa_niter_N: torch.svd_lowrank, N subspace iterations) costs about N. Measured on SmolLM2-135M, r 16, all
# linear layers, on the 2-core machine while shared: niter 4 took 87 s, niter 16 179 s, the exact SVD over 230 s
# (stopped); niter 4's top 16 directions hold 91-95% of the exact ones' singular energy (niter 16: 99%). Whatever
# N, the conversion at save is exact (W_res is W minus the adapter PEFT started from), so N trades only how
# principal the starting directions are against the minutes before the first step.
PISSA_NITER = 4
# Inits that move the top of each base weight into the adapter: the adapter-off model is no longer the base.
BASE_CHANGING_INITS = ("pissa", "olora", "loftq")


class Lora(Settings):
    r: int = Field(16, gt=0, description="LoRA rank: the size of the low-rank update.")
    alpha: int = Field(32, gt=0, description="LoRA scaling; the update is scaled by alpha / r.")
    dropout: float = Field(0.05, ge=0, lt=1, description="Dropout on the LoRA input, in [0, 1).")
    target_modules: str | list[str] = Field(
        "auto",
        description="Modules that get an adapter: 'auto' (every linear layer but the output head), "
        "'all-linear', or a list of module names.",
    )

    use_dora: bool = Field(
        False,
        description="DoRA: the update split into a direction (the LoRA product) and a learned magnitude per output "
        "(PEFT's use_dora). Slower per step; the accumulated LoRA product fast path is off for it.",
    )
    use_rslora: bool = Field(
        False,
        description="rsLoRA: scale the update by alpha / sqrt(r) instead of alpha / r (PEFT's use_rslora), which "
        "keeps large ranks (r 64 and up) learning.",
    )
    init: Literal["gaussian", "pissa", "olora", "eva", "loftq"] = Field(
        "gaussian",
        description="How the adapter starts (PEFT's init_lora_weights). gaussian: B at zero, PEFT's default. pissa: "
        f"from the top-r singular vectors of each weight (randomized SVD, pissa_niter_{PISSA_NITER}), the rest "
        "left as the base; olora: from a QR decomposition. Both change the base weights while training and are "
        "saved converted to a plain adapter on the untouched base. eva (data-driven) is refused: our trainers do "
        "not run PEFT's EVA pass over the data. loftq needs a CUDA GPU and bitsandbytes.",
    )
    loraplus_lr_ratio: float | None = Field(
        None,
        ge=1,
        allow_inf_nan=False,
        description="LoRA+: the learning rate of every B matrix is this many times the A matrices' "
        "(peft.optimizers.create_loraplus_optimizer); the LoRA+ paper uses 16. null: one learning rate.",
    )

    @model_validator(mode="after")
    def _supported_variant(self):
        if self.init == "eva":
            raise ValueError(
                "lora.init eva is not supported: EVA initialises the adapter from the activations of the training "
                "data, which PEFT computes in a separate pass (peft.initialize_lora_eva_weights) over a data loader "
                "of model inputs that our trainers do not run; use init pissa or olora, or gaussian"
            )
        if self.use_dora and self.init in BASE_CHANGING_INITS:
            raise ValueError(
                f"lora.use_dora with lora.init {self.init}: the {self.init} adapter is saved converted to a plain "
                "adapter on the untouched base (the difference of the trained and initial LoRA products), and that "
                "conversion has no place for DoRA's magnitudes; use one or the other"
            )
        return self

    def changes_base(self) -> bool:
        """Whether the init moves part of each base weight into the adapter: the adapter-off model is then not
        the model training started from."""
        return self.init in BASE_CHANGING_INITS

    def peft_init(self) -> bool | str:
        """PEFT's init_lora_weights for this init."""
        return {"gaussian": True, "pissa": f"pissa_niter_{PISSA_NITER}"}.get(self.init, self.init)

    def peft_target_modules(self) -> str | list[str]:
        # "auto" means every linear layer but the output head: what QLoRA found works best for small models.
        return "all-linear" if self.target_modules == "auto" else self.target_modules


class EarlyStopping(Settings):
    """Stop training when the held-out metric stops improving (transformers' EarlyStoppingCallback)."""

    patience: int = Field(
        gt=0, description="Stop after this many evaluations in a row without an improvement of the metric."
    )
    min_delta: float = Field(
        0.0, ge=0, allow_inf_nan=False, description="An improvement smaller than this does not count."
    )
    metric: str = Field(
        "eval_loss",
        min_length=1,
        description="The held-out figure watched, as the trainer logs it: eval_loss (lower is better; a name "
        "ending in 'loss' always is), or e.g. eval_rewards/accuracies (DPO, ORPO, KTO) or eval_reward (GRPO, "
        "RLOO), for which higher is better.",
    )


class TrainArgs(Settings):
    """dragon_train_args: what every trainer stage shares. Subclasses change defaults per stage kind."""

    epochs: float = Field(3, gt=0, description="Passes over the training rows.")
    learning_rate: float = Field(2e-4, gt=0, allow_inf_nan=False, description="Peak learning rate of the LoRA weights.")
    batch_size: int = Field(4, gt=0, description="Rows per device step.")
    grad_accum: int = Field(4, gt=0, description="Steps whose gradients add up to one update.")
    max_seq_len: int = Field(1024, gt=0, description="Longer rows are truncated to this many tokens.")
    max_steps: int | None = Field(None, gt=0, description="Stop after this many updates (overrides epochs).")
    warmup_ratio: float = Field(0.03, ge=0, lt=1, description="Share of steps warming the learning rate up.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    optim: Optimizer = Field(
        "adamw_torch_fused",
        description="The optimizer (transformers' `optim`): adamw_torch_fused (transformers' default, fused on CPU "
        "and GPU), adamw_torch, adafactor (less optimizer memory), sgd, adagrad or rmsprop.",
    )
    lr_scheduler_type: Schedule = Field(
        "linear",
        description="How the learning rate moves after warmup (transformers' schedules): linear decay to 0, cosine, "
        "cosine_with_restarts, polynomial, constant, constant_with_warmup or inverse_sqrt.",
    )
    max_grad_norm: float = Field(
        1.0,
        ge=0,
        allow_inf_nan=False,
        description="Clip the gradient's norm to this before each update; 0: no clipping.",
    )
    logging_steps: int = Field(5, gt=0, description="Log metrics every this many steps.")
    save_steps: int = Field(100, gt=0, description="Save a resumable checkpoint every this many steps.")
    gradient_checkpointing: bool = Field(False, description="Trade compute for memory.")
    seed: int = Field(42, description="Training seed.")
    eval_every: int | None = Field(
        None,
        gt=0,
        description="Score the held-out rows every this many steps while training (the held-out curve beside "
        "the training one); null: only after training.",
    )
    max_eval_rows: int | None = Field(
        MAX_EVAL_ROWS,
        gt=0,
        description="Held-out rows scored, while training and after it: a sample of this many drawn with the "
        "seed (the same rows each run), so a large held-out split does not make each evaluation take minutes. "
        "null: every held-out row.",
    )
    early_stopping: EarlyStopping | None = Field(
        None,
        description="Stop when the held-out metric has not improved for `patience` evaluations, e.g. "
        "{patience: 3}; needs eval_every.",
    )
    keep: Literal["best", "last"] = Field(
        "last",
        description="The adapter the stage keeps: 'last' (where training ended) or 'best' (the evaluation with "
        "the best held-out metric: early_stopping's metric, else eval_loss, eval_reward for grpo and rloo); 'best' "
        "needs eval_every and saves a checkpoint at each evaluation.",
    )

    @model_validator(mode="after")
    def _evaluated_while_training(self):
        asked = {"early_stopping": self.early_stopping is not None, "keep: best": self.keep == "best"}
        wants = [name for name, wanted in asked.items() if wanted]
        if wants and self.eval_every is None:
            raise ValueError(
                f"{' and '.join(wants)} read(s) the held-out metric while training, which is only scored with "
                "eval_every: set args.eval_every (e.g. 20 steps), or remove "
                f"{' and '.join(wants)}"
            )
        return self

    def best_metric(self) -> str:
        """The held-out figure that makes a step the best one: early_stopping's metric, else eval_loss."""
        return self.early_stopping.metric if self.early_stopping else "eval_loss"

    def greater_is_better(self) -> bool:
        # transformers' own rule for metric_for_best_model, stated so that the early stop and `keep: best` agree
        return not self.best_metric().endswith("loss")
