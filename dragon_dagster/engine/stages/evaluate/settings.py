"""The evaluate kind's settings: what the report measures, on how many held-out rows, with which judge."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from ...config.settings import Backend
from ...config.stage import METRICS_DOC, MetricNames, Stage, check_pass_k
from ...evaluate.contamination import DEFAULT_N, DIRTY_SHARE, MIN_WORDS
from ...evaluate.general_skills import SUITE_TAG, local_tasks


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
    metrics: MetricNames = Field(None, description=METRICS_DOC)
    pass_samples: int = Field(
        8,
        ge=0,
        description="On prompt data with an accuracy-like reward in the chain (and no tools): completions sampled "
        "per prompt by the base and the merged model for pass@1 and pass@k (eval/pass_at_1_<reward>, "
        "eval/pass_at_<k>_<reward> on both runs), with a sign test over the prompts. 0: greedy accuracy only.",
    )
    pass_k: int = Field(4, ge=1, description="The k of pass@k: tries per prompt, at most pass_samples.")
    pass_temperature: float | None = Field(
        None,
        gt=0,
        description="The temperature pass@k samples at; null: that of the chain's last sampling stage (GRPO's, "
        "RLOO's), else 1.0.",
    )
    skills: list[str] = Field(
        default_factory=list,
        description="General-skill tasks run on base and merged through lm-evaluation-harness, to see what the "
        "training cost apart from the pipeline's data: the bundled suite's "
        f"{', '.join(local_tasks())} (or {SUITE_TAG} for all of them; local data, no hub), or any lm-eval task "
        "name where its data is reachable. Empty: none.",
    )
    skills_limit: int | None = Field(
        None, gt=0, description="At most this many items of each skills task (null: all of them)."
    )
    contamination_ngram: int = Field(
        DEFAULT_N,
        ge=MIN_WORDS,
        le=64,
        description="The contamination check (`<stage>_not_contaminated`, blocking, on the merged model): an "
        "evaluation row (the held-out split of every dataset a stage trains on or this report measures, the "
        "bundled skills items) is contaminated when its runs of this many words (lower-cased, punctuation removed) "
        "that a training split of another dataset of the pipeline holds cover contamination_share of it; a row "
        f"shorter than that must occur whole, and one under {MIN_WORDS} words is not checked. 13 as GPT-3 and "
        "lm-eval decontaminate.",
    )
    contamination_share: float = Field(
        DIRTY_SHARE,
        ge=0,
        le=1,
        description="The share of an evaluation row's words that runs of contamination_ngram words shared with "
        'training must cover for the row to count as contaminated (0.8: Llama 2\'s "dirty" sample). A greeting '
        "or sign-off every reply shares covers a small share; a row that was trained on, all of it. 0: any shared "
        "run, as GPT-3 counted.",
    )
    allow_contamination: bool = Field(
        False, description="Report contaminated evaluation rows as a warning instead of stopping the report."
    )

    @model_validator(mode="after")
    def _pass_k_fits(self):
        check_pass_k(self)
        return self

    def reads(self) -> list[str]:
        return [self.dataset]
