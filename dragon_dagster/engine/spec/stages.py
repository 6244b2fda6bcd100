"""One typed model per stage kind: the single source of its defaults, ranges, cross-field checks and docs.

The same model validates the pipeline YAML (and `dg check yaml`, through the component's JSON schema), shapes
the launchpad config of the stage's asset with its effective values, is written into the worker's job.json
and read back there, where the trainer turns it into TRL's config. Like TRL's `GRPOConfig`, each field says
what it does in its description.

Numbers written in YAML as `2e-4` arrive as strings (PyYAML follows YAML 1.1); pydantic's lax mode reads them
as numbers, so they are accepted wherever a number is expected.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

NAME_PATTERN = r"^[a-z][a-z0-9_]*$"


class Settings(BaseModel):
    """Unknown keys are errors: a typo in YAML must not silently fall back to a default."""

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)  # no key echoed into a log


class Lora(Settings):
    r: int = Field(16, gt=0, description="LoRA rank: the size of the low-rank update.")
    alpha: int = Field(32, gt=0, description="LoRA scaling; the update is scaled by alpha / r.")
    dropout: float = Field(0.05, ge=0, lt=1, description="Dropout on the LoRA input, in [0, 1).")
    target_modules: str | list[str] = Field(
        "auto",
        description="Modules that get an adapter: 'auto' (every linear layer but the output head), "
        "'all-linear', or a list of module names.",
    )

    def peft_target_modules(self) -> str | list[str]:
        # "auto" means every linear layer but the output head: what QLoRA found works best for small models.
        return "all-linear" if self.target_modules == "auto" else self.target_modules


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
    logging_steps: int = Field(5, gt=0, description="Log metrics every this many steps.")
    save_steps: int = Field(100, gt=0, description="Save a resumable checkpoint every this many steps.")
    gradient_checkpointing: bool = Field(False, description="Trade compute for memory.")
    seed: int = Field(42, description="Training seed.")


class PreferenceArgs(TrainArgs):
    """dragon_prefer's defaults: a lower learning rate and fewer passes than SFT."""

    epochs: float = Field(2, gt=0, description="Passes over the training pairs.")
    learning_rate: float = Field(5e-5, gt=0, allow_inf_nan=False, description="Peak learning rate of the LoRA weights.")


class GRPOArgs(TrainArgs):
    """dragon_reinforce's defaults: one pass, no accumulation, frequent checkpoints (each step samples)."""

    epochs: float = Field(1, gt=0, description="Passes over the prompts.")
    learning_rate: float = Field(1e-5, gt=0, allow_inf_nan=False, description="Peak learning rate of the LoRA weights.")
    grad_accum: int = Field(1, gt=0, description="Steps whose gradients add up to one update.")
    save_steps: int = Field(20, gt=0, description="Save a resumable checkpoint every this many steps.")


class Stage(Settings):
    """What every stage has: its asset's name and its kind."""

    name: str = Field(pattern=NAME_PATTERN, description="The asset's name, unique in the pipeline.")
    kind: str

    def reads(self) -> list[str]:
        """Names of earlier datasets or stages this stage names in its own settings."""
        return []


# ------------------------------------------------------------------------------------------- datasets


class DatasetStage(Stage):
    source: str | None = Field(None, description="A dataset under `datasets:` to map (or give `path`).")
    path: str | None = Field(
        None,
        description="A file to read directly (CSV, JSONL, JSON, Parquet, a saved "
        "`datasets` directory), relative to the pipeline's folder; "
        "'example:NAME' reads a bundled example file.",
    )
    format: Literal["csv", "jsonl", "json", "parquet"] | None = Field(
        None, description="File format when the extension does not tell."
    )
    system: str | None = Field(None, description="System prompt: text or a template such as '{persona}'.")
    eval_frac: float = Field(0.05, ge=0, lt=1, description="Share of rows held out for evaluation, in [0, 1).")
    seed: int = Field(42, description="Seed of the held-out split.")
    dedupe: bool = Field(
        True,
        description="Drop exact duplicate rows (same prompt turns and same reply or answer) "
        "before the split; the count is in the asset's metadata.",
    )
    group_by: str | None = Field(
        None,
        description="A source column or a template such as '{subject}': rows with "
        "the same value go to the same side of the split. Default: rows "
        "with the same user prompt stay together.",
    )
    allow_leakage: bool = Field(
        False,
        description="Let the stages after this one run even when held-out prompts "
        "or answers also appear in train (the held_out_not_leaking "
        "check then only warns).",
    )

    @model_validator(mode="after")
    def _one_origin(self):
        if (self.source is None) == (self.path is None):
            raise ValueError(f"dataset stage {self.name!r} needs exactly one of source (a dataset name) or path")
        return self

    def reads(self) -> list[str]:
        return [self.source] if self.source else []


class ChatDataset(DatasetStage):
    """Prompt and reply pairs for SFT (dragon_map): columns or `{column}` templates, or a conversations column."""

    kind: Literal["chat_dataset"]
    prompt: str | None = Field(None, description="The user turn: a column or a template like '{subject}\\n\\n{body}'.")
    response: str | None = Field(None, description="The assistant reply: a column or a template.")
    conversations: str | None = Field(
        None,
        description="A column of whole conversations (lists of role/content "
        "turns); the last assistant turn is trained on.",
    )

    @model_validator(mode="after")
    def _mapping(self):
        if self.conversations is None and not (self.prompt and self.response):
            raise ValueError(
                f"chat_dataset {self.name!r} needs prompt and response (columns or templates), or conversations"
            )
        return self


class PairsDataset(DatasetStage):
    """Preference pairs (dragon_map_pairs): a prompt, a chosen and a rejected reply."""

    kind: Literal["pairs_dataset"]
    prompt: str = Field(description="The user turn: a column or a template.")
    chosen: str = Field(description="The preferred reply: a column or a template.")
    rejected: str = Field(description="The worse reply: a column or a template.")


class RatedDataset(DatasetStage):
    """Single replies labelled liked or disliked, without a pair (for KTO): a prompt, a reply and a label."""

    kind: Literal["rated_dataset"]
    prompt: str = Field(description="The user turn: a column or a template.")
    reply: str = Field(description="The rated reply: a column or a template.")
    label: str = Field(
        description="The column saying whether the reply is liked: true/false, 1/0, yes/no, "
        "up/down, good/bad, liked/disliked or desirable/undesirable."
    )


class PromptDataset(DatasetStage):
    """Prompts to practise on with rewards (dragon_map_prompts); every other column reaches the rewards."""

    kind: Literal["prompt_dataset"]
    prompt: str = Field(description="The user turn: a column or a template.")
    reference: str | None = Field(None, description="The checkable answer rewards compare with.")


# ------------------------------------------------------------------------------------- synthesized data


def no_inline_secret(backend: str | dict[str, Any]) -> str | dict[str, Any]:
    """A key written in the pipeline would be kept in job files, manifests and MLflow params: refuse it."""
    if isinstance(backend, dict):
        headers = backend.get("headers") or {}
        if "api_key" in backend or any(str(h).lower() in ("authorization", "api-key", "x-api-key") for h in headers):
            raise ValueError(
                "do not write an API key in the pipeline (it would be kept in job files, manifests "
                "and MLflow): put it in an environment variable and name that, e.g. "
                "api_key_env: OPENAI_API_KEY"
            )
    return backend


# "reference", a model name or directory, or a server {base_url, model, api_key_env, timeout, ...}
Backend = Annotated[str | dict[str, Any], AfterValidator(no_inline_secret)]


class PreferencePairs(Stage):
    """Pairs made from the latest adapter's own samples (dragon_synthesize_pairs)."""

    kind: Literal["preference_pairs"]
    dataset: str = Field(description="An earlier chat dataset whose prompts (and replies) are used.")
    mode: Literal["teacher", "judge"] = Field(
        "teacher",
        description="teacher: the teacher's reply is chosen, the student's rejected. judge: the "
        "student's best and worst samples by a judge's score.",
    )
    teacher: Backend = Field(
        "reference", description="'reference' (the dataset's own reply), a model, or a server {url, model}."
    )
    judge: Backend | None = Field(
        None, description="Judge mode: the scoring model (default: the base model; weak, use a server)."
    )
    rubric: str | None = Field(None, description="What the judge scores for.")
    n: int = Field(100, ge=1, description="Prompts to make pairs from.")
    n_samples_per_prompt: int = Field(4, ge=1, description="Judge mode: student samples per prompt (>= 2).")
    min_gap: float = Field(2.0, ge=0, description="Judge mode: least score gap between chosen and rejected.")
    temperature: float = Field(0.8, gt=0, le=3, description="Student sampling temperature, in (0, 3].")
    max_new_tokens: int = Field(256, gt=0, description="Length limit of sampled replies.")
    eval_frac: float = Field(0.05, ge=0, lt=1, description="Share of pairs held out.")
    seed: int = Field(42, description="Seed of the prompt order and the split.")

    @model_validator(mode="after")
    def _judge_needs_samples(self):
        if self.mode == "judge" and self.n_samples_per_prompt < 2:
            raise ValueError("judge mode needs n_samples_per_prompt >= 2 to have a best and a worst sample")
        return self

    def reads(self) -> list[str]:
        return [self.dataset]


class SyntheticDataset(Stage):
    """Teacher-written SFT rows with a quality pass (dragon_synthesize)."""

    kind: Literal["synthetic_dataset"]
    dataset: str = Field(description="An earlier dataset whose prompts the teacher answers.")
    teacher: Backend = Field(description="The teacher: a model name or directory, or a server {url, model}.")
    system: str | None = Field(None, description="System prompt given to the teacher.")
    max_new_tokens: int = Field(512, gt=0, description="Length limit of teacher replies.")
    temperature: float = Field(0.7, ge=0, le=3, description="Teacher sampling temperature.")
    judge: Backend | None = Field(None, description="Optional judge gate: a model or server scoring each reply.")
    min_score: float = Field(7.0, ge=0, le=10, description="Judge gate: keep rows scored at least this (1-10).")
    rubric: str | None = Field(None, description="What the judge scores for.")
    dedupe: bool = Field(True, description="Drop exact and near-duplicate replies.")
    near_dup_threshold: float = Field(
        0.92, gt=0, le=1, description="Similarity above which replies are near-duplicates."
    )
    min_chars: int = Field(1, ge=0, description="Drop replies shorter than this.")
    max_chars: int | None = Field(None, gt=0, description="Drop replies longer than this.")
    min_alpha_ratio: float = Field(0.0, ge=0, le=1, description="Drop replies with a smaller share of letters.")
    eval_frac: float = Field(0.05, ge=0, lt=1, description="Share of rows held out.")
    seed: int = Field(42, description="Seed of the split.")

    def reads(self) -> list[str]:
        return [self.dataset]


# --------------------------------------------------------------------------------------------- trainers


class TrainerStage(Stage):
    """A LoRA adapter trained on a dataset, continuing from the training stage before it (folded in)."""

    dataset: str = Field(description="An earlier dataset stage whose rows train this stage.")
    lora: Lora = Field(default_factory=Lora, description="The adapter's shape (dragon_lora).")
    args: TrainArgs = Field(default_factory=TrainArgs, description="Trainer arguments (dragon_train_args).")
    n_samples: int = Field(10, ge=0, description="Held-out prompts answered after training (samples.jsonl).")
    max_new_tokens: int = Field(128, gt=0, description="Length limit of sample replies.")

    def objective(self) -> str:
        """The training objective, as tagged in MLflow and run by the worker."""
        return self.kind

    def reads(self) -> list[str]:
        return [self.dataset]


def known_metrics(names: list[str] | None) -> list[str] | None:
    """Task metric names, each one of engine/evaluate/metrics.py's METRICS."""
    from ..evaluate.metrics import METRICS

    unknown = [n for n in names or [] if n not in METRICS]
    if unknown:
        raise ValueError(f"unknown metric(s) {unknown}; known: {', '.join(METRICS)}")
    if names is not None and not names:
        raise ValueError("metrics: name at least one metric, or leave it out for the defaults")
    return names


METRICS_DOC = (
    "Task metrics of the held-out replies, from exact, contains, token_f1, json_valid, numeric, "
    "length_ratio. Default: exact, contains, token_f1 and length_ratio, plus numeric when most "
    "references are numbers and json_valid when most parse as JSON."
)


class SFT(TrainerStage):
    """Supervised fine-tuning with TRL's SFTTrainer; loss on the final assistant turn only."""

    kind: Literal["sft"]
    metrics: Annotated[list[str] | None, AfterValidator(known_metrics)] = Field(None, description=METRICS_DOC)


class Preference(TrainerStage):
    """Preference optimization: DPO (no reference model needed with LoRA) or ORPO on pairs, or KTO on single
    liked/disliked replies (a rated_dataset; pairs are split into a liked and a disliked reply)."""

    kind: Literal["preference"]
    method: Literal["dpo", "orpo", "kto"] = Field(
        "dpo", description="dpo or orpo (pairs), or kto (TRL's KTOTrainer: rated replies without a pair)."
    )
    beta: float = Field(
        0.1, gt=0, allow_inf_nan=False, description="Strength of the preference (DPO, KTO: KL to the starting model)."
    )
    desirable_weight: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="KTO: weight of the liked replies' loss. Default: both weights balance the counts (the side "
        "with fewer replies weighs more, as the KTO paper advises).",
    )
    undesirable_weight: float | None = Field(
        None, gt=0, allow_inf_nan=False, description="KTO: weight of the disliked replies' loss."
    )

    @model_validator(mode="after")
    def _kto_weights(self):
        if self.method != "kto" and (self.desirable_weight or self.undesirable_weight):
            raise ValueError(
                f"stage {self.name!r}: desirable_weight and undesirable_weight are KTO settings; "
                f"method is {self.method}"
            )
        if self.method == "kto" and self.args.batch_size < 2:
            raise ValueError(
                f"stage {self.name!r}: KTO needs batch_size >= 2 (it estimates its KL term from the "
                "other replies in a batch)"
            )
        return self

    args: PreferenceArgs = Field(default_factory=PreferenceArgs, description="Trainer arguments.")

    def objective(self) -> str:
        return self.method


class GRPO(TrainerStage):
    """Reinforcement learning with verifiable rewards: TRL's GRPOTrainer (dragon_reinforce)."""

    kind: Literal["grpo"]
    rewards: list[dict[str, Any]] = Field(
        min_length=1,
        description="Verifiable rewards, summed by weight, e.g. [{type: numeric}, "
        "{type: length, max_chars: 16, weight: 0.2}]; see the README for the types.",
    )
    group_size: int = Field(4, ge=2, le=64, description="Completions per prompt, 2..64.")
    beta: float = Field(0.04, ge=0, le=10, description="KL penalty to the starting model, 0..10.")
    temperature: float = Field(1.0, ge=0.05, le=3, description="Sampling temperature, 0.05..3.")
    max_eval_prompts: int = Field(64, ge=0, description="Held-out prompts scored before and after training.")
    kl_bound: float = Field(1.0, gt=0, description="The kl_within_bound check warns above this KL.")
    zero_std_limit: float = Field(
        0.9,
        gt=0,
        le=1,
        description="The groups_have_reward_variance check warns when this share of groups has no reward variance.",
    )
    truncation_limit: float = Field(
        0.25,
        gt=0,
        le=1,
        description="The completions_not_truncated check warns when "
        "more than this share of completions is cut off "
        "at max_new_tokens (mean over the steps).",
    )
    block_on_reward_hacking: bool = Field(
        False,
        description="Make format_not_rising_while_accuracy_falls a blocking check with severity ERROR: when "
        "it fails, the stages after this one are not materialized in the same run.",
    )
    args: GRPOArgs = Field(default_factory=GRPOArgs, description="Trainer arguments.")

    @model_validator(mode="after")
    def _rewards_are_known(self):
        from ..rewards import OPTIONS

        for i, reward in enumerate(self.rewards):
            if reward.get("type") not in OPTIONS:
                raise ValueError(
                    f"rewards[{i}]: unknown reward type {reward.get('type')!r}; known: {', '.join(OPTIONS)}"
                )
        return self


# ------------------------------------------------------------------------------------ merge and evaluate


class Merge(Stage):
    """The adapter chain folded into the base model: a standalone directory plain transformers loads."""

    kind: Literal["merge"]
    sample_prompt: str = Field(
        "Hello! What can you help me with?", description="A prompt whose reply is shown in the asset's metadata."
    )


class Evaluate(Stage):
    """Base model against the merged model on the same held-out rows: loss, metrics, samples, judge."""

    kind: Literal["evaluate"]
    dataset: str = Field(description="The dataset whose held-out rows are measured.")
    n_samples: int = Field(5, ge=0, description="Sample replies shown side by side.")
    max_eval_rows: int = Field(50, gt=0, description="Held-out rows measured (at most).")
    max_new_tokens: int = Field(128, gt=0, description="Length limit of generated replies.")
    n_judge: int = Field(5, ge=0, description="Held-out prompts judged pairwise, both orders (0: none).")
    judge: Backend | None = Field(
        None,
        description="The pairwise judge: a model or a server {url, model}; default: the base model (weak, offline).",
    )
    metrics: Annotated[list[str] | None, AfterValidator(known_metrics)] = Field(None, description=METRICS_DOC)

    def reads(self) -> list[str]:
        return [self.dataset]


# ------------------------------------------------------------------------------------------------ export

GGUF_FORMATS = ("f16", "q8_0")


class Export(Stage):
    """The merged model as GGUF files (llama.cpp, Ollama) with an Ollama Modelfile and a model card."""

    kind: Literal["export"]
    model: str | None = Field(
        None,
        description="The merge stage whose model is exported; default: the pipeline's "
        "merge stage (the last one before this stage).",
    )
    formats: list[Literal["f16", "q8_0"]] = Field(
        default_factory=lambda: list(GGUF_FORMATS),
        description="GGUF files to write: f16 (the merged weights in 16 bits) and/or q8_0 (8-bit, half the size).",
    )
    ollama: bool = Field(
        True, description="Write an Ollama Modelfile (chat template, stop tokens, system prompt) beside the GGUF files."
    )
    system: str | None = Field(
        None,
        description="The Modelfile's system prompt; default: the system prompt of the "
        "chat dataset the merged model's first stage trained on, if fixed.",
    )
    model_name: str | None = Field(
        None,
        pattern=r"^[a-z0-9][a-z0-9._-]*$",
        description="Name in the GGUF metadata, the file names and `ollama create`; "
        "lower-case letters, digits, '.', '_', '-'. Default: the pipeline's "
        "name.",
    )

    @model_validator(mode="after")
    def _formats(self):
        if not self.formats:
            raise ValueError(f"export stage {self.name!r}: formats must name at least one of {', '.join(GGUF_FORMATS)}")
        if len(set(self.formats)) != len(self.formats):
            raise ValueError(f"export stage {self.name!r}: formats lists a format twice: {self.formats}")
        return self

    def reads(self) -> list[str]:
        return [self.model] if self.model else []


__all__ = [
    "Settings",
    "Lora",
    "TrainArgs",
    "PreferenceArgs",
    "GRPOArgs",
    "Stage",
    "DatasetStage",
    "ChatDataset",
    "PairsDataset",
    "RatedDataset",
    "PromptDataset",
    "PreferencePairs",
    "SyntheticDataset",
    "TrainerStage",
    "SFT",
    "Preference",
    "GRPO",
    "Merge",
    "Evaluate",
    "Export",
]
