"""What an evaluate stage reports (report.json, and its worker's result): base against merged on the same rows,
each stage's figures, the judge, samples, and a retraining's held-out feedback figures."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from ...config.results import HeldOutRows, Markdown, PassAtK, StageResult, finite
from ...evaluate.replies import eval_metrics
from ...release.card import cell
from . import skills
from .markdown import pass_at_k_markdown, stage_change_markdown, tool_markdown


class ReportResult(StageResult):
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")

    task: Literal["chat", "prompts"]
    held_out: bool
    rows: int
    # the rows scored out of the split's (a seeded sample of max_eval_rows); absent from a report made before it
    held_out_rows: HeldOutRows | None = None
    metrics: list[str] = Field(default_factory=list)
    metrics_chosen_by: str = "references"
    base: dict[str, Any]  # eval_loss, perplexity, eval_tokens, metrics; on prompts rewards, accuracy, reward
    merged: dict[str, Any]
    merged_not_worse: bool | None
    not_worse_on: str | None = None  # on prompts: what the verdict compares
    computed_on: dict[str, Any] = Field(default_factory=dict)
    rewards: list[dict[str, Any]] = Field(default_factory=list)  # on prompts: the rewards scored with
    stage_nll: list[dict[str, Any]] = Field(default_factory=list)
    # each stage against the model before it, row by row: mean NLLs, the paired test's p-value, the verdict
    stage_changes: list[dict[str, Any]] = Field(default_factory=list)
    stages: list[dict[str, Any]] = Field(default_factory=list)  # each stage's own figures
    judge: dict[str, Any] = Field(default_factory=dict)
    samples: list[dict[str, Any]] = Field(default_factory=list)
    loss_plot: str | None = None
    feedback: dict[str, Any] | None = None  # a retraining: the figures on held-out feedback
    objectives: list[dict[str, Any]] = Field(default_factory=list)
    # pass@1 and pass@k: each sampling stage's model against its start, and merged against base on prompt data
    pass_at_k: list[PassAtK] = Field(default_factory=list)
    tool_use: dict[str, Any] | None = None  # the tools, the paired test, samples (figures: base/merged["tools"])
    skills: dict[str, Any] | None = None  # general skills, base against merged (skills.py)
    # the held-out rows as an MLflow evaluation: dataset, base and merged runs, the UI link (or the error)
    mlflow_evaluation: dict[str, Any] | None = None

    def card_table(self) -> str:
        """The base-against-merged table a model card shows."""
        report = self.model_dump()
        base, merged = report.get("base", {}), report.get("merged", {})
        names = [n for n in ("eval_loss", "perplexity", "reward") if n in base] + list(base.get("metrics", {}))
        split = "held-out" if report.get("held_out", True) else "training"
        lines = [
            f"{report.get('rows')} {split} rows, base model against the merged model (before quantization).",
            "",
            "| metric | base | merged |",
            "|---|---|---|",
        ]
        for n in names:
            lines.append(
                f"| {n} | {cell(base.get(n, base.get('metrics', {}).get(n)))} | "
                f"{cell(merged.get(n, merged.get('metrics', {}).get(n)))} |"
            )
        return "\n".join(lines)

    def base_metrics(self) -> dict[str, float]:
        """What the `base` MLflow run logs: the base model's held-out figures."""
        return {**eval_metrics(self.base), **self.pass_metrics("before"), **skills.run_metrics(self.skills, "base")}

    def pass_metrics(self, when: str) -> dict[str, float]:
        """pass@1 and pass@k of base ("before") or merged ("after") on the report's prompts, under the names a
        sampling stage logs its own (eval/pass_at_1_<reward>, eval/pass_at_<k>_<reward>)."""
        return {
            f"eval/{name}": v
            for change in self.pass_at_k
            if change.against == "base"
            for name, v in change.figures(when).items()
        }

    def run_metrics(self) -> dict[str, float]:
        """What the report's MLflow run logs: the merged model's figures, the judge's win rates and a retraining's
        held-out feedback figures. The held-out loss after each stage is not here: it is `heldout/nll` on that
        stage's own run and one step of the pipeline run's series (held_out_figures), where it charts as a line
        rather than as one single-bar chart per stage."""
        judged = finite(
            {
                f"judge/{name}_win_rate": figures.get("win_rate")
                for name, figures in self.judge.items()
                if isinstance(figures, dict)
            }
        )
        return {
            **eval_metrics(self.merged),
            **self.pass_metrics("after"),
            **judged,
            **self.feedback_metrics(),
            **skills.run_metrics(self.skills, "merged"),
        }

    def held_out_figures(self) -> list[dict[str, Any]]:
        """Every model's figures on the report's held-out rows under one set of names, in the order the chain
        made them: base, the model after each stage, merged. [{"model": "base" | <stage> | "merged", "metrics":
        {"heldout/nll": ..., "heldout/perplexity": ..., on base and merged also "heldout/<task metric>"}}]. The
        names differ from a trainer's own eval/loss, which is on that stage's data and objective."""

        def named(figures: dict) -> dict[str, float]:
            renamed = {"eval/loss": "heldout/nll"}
            return {renamed.get(k, "heldout/" + k.split("/", 1)[1]): v for k, v in eval_metrics(figures).items()}

        out = [{"model": "base", "metrics": named(self.base)}]
        for entry in self.stage_nll:
            if entry.get("stage"):
                figures = {"heldout/nll": entry.get("eval_loss"), "heldout/perplexity": entry.get("perplexity")}
                out.append({"model": entry["stage"], "metrics": finite(figures)})
        out.append({"model": "merged", "metrics": named(self.merged)})
        return out

    def feedback_metrics(self) -> dict[str, float]:
        """A retraining's held-out feedback figures as flat numbers: feedback/<metric>_start, _retrained, _gain."""
        out = {}
        for name in ("reward", "pair_accuracy", "liked_share"):
            for when, value in ((self.feedback or {}).get(name) or {}).items():
                if when in ("start", "retrained", "gain"):
                    out[f"feedback/{name}_{when}"] = value
        return finite(out)

    def metadata(self) -> dict[str, Any]:
        out: dict[str, Any] = {"merged_not_worse": self.merged_not_worse}
        if self.held_out_rows:
            out["held_out_rows"] = self.held_out_rows.sentence()
        if self.task == "prompts":  # no loss on prompts: each reward, base against merged
            out.update(
                computed_on=self.computed_on,
                rewards=Markdown(self.reward_table()),
                **{f"base/{k}": v for k, v in eval_metrics(self.base).items()},
            )
        else:
            out.update(base_eval_loss=self.base["eval_loss"], merged_eval_loss=self.merged["eval_loss"])
        out.update({f"merged/{k}": v for k, v in eval_metrics(self.merged).items()})
        out.update(self.feedback_metrics())
        if self.stage_changes:  # did each stage help: where people look, beside the asset
            out["stage_changes"] = Markdown("\n".join(stage_change_markdown(self.stage_changes)))
        if self.pass_at_k:
            out["pass_at_k"] = Markdown("\n".join(pass_at_k_markdown(self.model_dump())))
        if self.tool_use:
            out["tool_use"] = Markdown("\n".join(tool_markdown(self.model_dump())))
        if self.skills:
            out["skills"] = Markdown("\n".join(skills.markdown(self.model_dump())))
        if self.objectives:
            out["objectives"] = [
                {k: o.get(k) for k in ("objective", "ran", "rows", "unit", "records", "skipped")}
                for o in self.objectives
            ]
        return out

    def reward_table(self) -> str:
        """Each reward's mean (and share scoring 1 where accuracy-like), base against merged, as Markdown."""
        base, merged = self.base, self.merged
        lines = [
            f"On {self.computed_on['rows']} {self.computed_on['split']} prompts.",
            "",
            "| reward | type | weight | base | merged | base share scoring 1 | merged share scoring 1 |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in self.rewards:
            name, accuracy = r["name"], r["name"] in base.get("accuracy", {})
            lines.append(
                f"| {name} | {r['type']} | {r['weight']:g} | {base['rewards'][name]:.4f} | "
                f"{merged['rewards'][name]:.4f} | "
                + (f"{base['accuracy'][name]:.4f} | {merged['accuracy'][name]:.4f} |" if accuracy else " |  |")
            )
        if "reward" in base:
            lines.append(f"| weighted total | | | {base['reward']:.4f} | {merged['reward']:.4f} | | |")
        else:
            lines.append("No stage of the merged model's chain trained against rewards: no rewards.")
        return "\n".join(lines)
