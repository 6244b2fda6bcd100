"""The merge_adapters kind's settings: adapters trained on the same base, combined into one adapter by PEFT's
`add_weighted_adapter`."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BeforeValidator, Field, model_validator

from ...config.settings import Settings
from ...config.stage import Continues, Stage

# PEFT's combination_type values (LoraModel.add_weighted_adapter), and which of its arguments each one reads: a
# setting the chosen combination ignores is refused rather than silently unused.
Combination = Literal[
    "linear",
    "svd",
    "cat",
    "ties",
    "ties_svd",
    "dare_ties",
    "dare_linear",
    "dare_ties_svd",
    "dare_linear_svd",
    "magnitude_prune",
    "magnitude_prune_svd",
]
PRUNING = {"ties", "dare_ties", "dare_linear", "magnitude_prune"}  # need a density (and their _svd forms)
SIGNED = {"ties", "dare_ties"}  # elect a sign per parameter: majority_sign_method (and their _svd forms)
SAME_RANK = {"linear", "ties", "dare_ties", "dare_linear", "magnitude_prune"}  # PEFT combines A and B directly


def base_combination(combination: str) -> str:
    return combination.removesuffix("_svd")


def uses_svd(combination: str) -> bool:
    return combination.endswith("svd")


class AdapterRef(Settings):
    """One input adapter: an earlier adapter stage of this pipeline, or an adapter artifact made elsewhere."""

    stage: str | None = Field(None, description="An earlier training (or merge_adapters) stage of this pipeline.")
    artifact: str | None = Field(
        None,
        description="An adapter artifact directory made elsewhere (another pipeline's training stage: "
        "runs/artifacts/<pipeline>/<stage>-<run>), absolute or relative to the pipeline's folder. It must hold "
        "an adapter manifest on the same base model.",
    )

    @model_validator(mode="after")
    def _one_of(self):
        if (self.stage is None) == (self.artifact is None):
            raise ValueError(
                "an adapter is either an earlier stage of this pipeline (`stage: NAME`, or just `NAME`) or an "
                "adapter artifact directory (`artifact: PATH`): give exactly one"
            )
        return self

    @property
    def label(self) -> str:
        return self.stage or self.artifact


def _name_alone(data: Any) -> Any:
    return {"stage": data} if isinstance(data, str) else data  # `- sft_support` names a stage


# an adapter written as a stage's name alone, or as a mapping (the JSON schema says both)
Adapter = Annotated[AdapterRef, BeforeValidator(_name_alone, json_schema_input_type=str | AdapterRef)]


class MergeAdapters(Stage):
    """Adapters trained on the same base combined into one (PEFT's add_weighted_adapter); the result is an adapter
    like a trainer's: a merge folds it, later training stages continue from it."""

    kind: Literal["merge_adapters"]
    continues: ClassVar[Continues] = "never"  # it reads the adapters it names, not the stage before it

    adapters: list[Adapter] = Field(
        min_length=2,
        description="The adapters to combine, two or more: earlier adapter stages of this pipeline by name (a "
        "name alone, or `{stage: NAME}`), or "
        "`{artifact: PATH}` for an adapter artifact made elsewhere. All must be trained on the same base model "
        "with the same adapters folded in before them.",
    )
    weights: list[float] | None = Field(
        None,
        description="Each adapter's weight, in the order of `adapters` (PEFT's weights). Default: equal, summing "
        "to 1 (the average).",
    )
    combination: Combination = Field(
        "svd",
        description="PEFT's combination_type. cat is exact (its rank is the sum of the inputs'); svd (PEFT's "
        "default) factors the weighted sum of the updates to `svd_rank` (exact when that is at least the sum of "
        "the input ranks); linear mixes the A and B matrices (PEFT calls it a rough approximation); ties, "
        "dare_ties, dare_linear and magnitude_prune prune each adapter's update to `density` first (TIES, DARE) "
        "and need inputs of one rank; their _svd forms prune the full updates and factor the result.",
    )
    density: float | None = Field(
        None,
        gt=0,
        le=1,
        description="The share of each adapter's update kept by ties, dare_*, magnitude_prune (and their _svd "
        "forms), 0..1; required by those, refused by the others.",
    )
    majority_sign_method: Literal["total", "frequency"] | None = Field(
        None,
        description="How ties and dare_ties elect each parameter's sign: total (PEFT's default: by summed "
        "magnitude) or frequency (by count). Only for those.",
    )
    svd_rank: int | None = Field(
        None,
        gt=0,
        description="The combined adapter's rank for svd and the _svd forms. Default: the largest input rank.",
    )
    svd_clamp: float | None = Field(
        None, gt=0, lt=1, description="For svd and the _svd forms: clamp the factors at this quantile of their values."
    )
    seed: int = Field(0, description="Seeds DARE's random drops, so the same settings make the same adapter.")

    def reads(self) -> list[str]:
        return [ref.stage for ref in self.adapters if ref.stage]

    def stages(self) -> list[str]:
        """The pipeline's stages it combines, in order."""
        return self.reads()

    def artifacts(self) -> list[str]:
        return [ref.artifact for ref in self.adapters if ref.artifact]

    def effective_weights(self) -> list[float]:
        return self.weights if self.weights is not None else [1.0 / len(self.adapters)] * len(self.adapters)

    @model_validator(mode="after")
    def _as_peft_needs(self):
        name, combination, base = self.name, self.combination, base_combination(self.combination)
        if self.weights is not None and len(self.weights) != len(self.adapters):
            raise ValueError(
                f"merge_adapters stage {name!r}: {len(self.weights)} weights for {len(self.adapters)} adapters: give "
                "one weight per adapter, in the same order, or leave weights out for equal ones"
            )
        labels = [ref.label for ref in self.adapters]
        if len(set(labels)) != len(labels):
            raise ValueError(f"merge_adapters stage {name!r}: an adapter is named twice in {labels}")
        if base in PRUNING and self.density is None:
            raise ValueError(
                f"merge_adapters stage {name!r}: combination {combination} prunes each update to a density: set "
                "density (0..1, the share kept; 0.2 to 0.5 is usual)"
            )
        if base not in PRUNING and self.density is not None:
            raise ValueError(
                f"merge_adapters stage {name!r}: combination {combination} prunes nothing, so density would be "
                "unused: remove it, or use ties, dare_ties, dare_linear or magnitude_prune"
            )
        if base not in SIGNED and self.majority_sign_method is not None:
            raise ValueError(
                f"merge_adapters stage {name!r}: majority_sign_method is read only by ties and dare_ties (and their "
                f"_svd forms), not {combination}: remove it"
            )
        for field in ("svd_rank", "svd_clamp"):
            if getattr(self, field) is not None and not uses_svd(combination):
                raise ValueError(
                    f"merge_adapters stage {name!r}: {field} is read only by svd and the _svd forms, not "
                    f"{combination}: remove it or pick one of those"
                )
        return self

    def check_inputs(self, pipeline) -> None:
        """Each stage it names makes an adapter of the chain (a training or merge_adapters stage, not a reward
        model), and all continue from the same stages (the same adapters folded in before them)."""
        befores = {}
        for name in self.stages():
            stage = pipeline.stage(name)
            if pipeline.role_of(stage) not in ("training", "merge_adapters") or not stage.in_chain:
                raise ValueError(
                    f"merge_adapters stage {self.name!r}: {name!r} ({stage.kind}) makes no adapter of the chain to "
                    "combine: name training stages (sft, dpo, grpo ...) or merge_adapters stages"
                )
            befores[name] = chain_before(pipeline, name)
        if len({tuple(b) for b in befores.values()}) > 1:
            shown = "; ".join(f"{n} continues {' -> '.join(b) or 'the base model'}" for n, b in befores.items())
            raise ValueError(
                f"merge_adapters stage {self.name!r}: its adapters are trained on different models ({shown}), so "
                "their updates do not add up: combine adapters that start from the same model (give a later sft "
                "stage `start: base` to train it on the pipeline's model rather than continue the chain)"
            )


def chain_before(pipeline, name: str) -> list[str]:
    """The pipeline's stages whose adapters a stage's adapter sits on (folded in before it), oldest first."""
    stage = pipeline.stage(name)
    if isinstance(stage, MergeAdapters):  # the common chain of its inputs
        stages = stage.stages()
        return chain_before(pipeline, stages[0]) if stages else []
    previous = pipeline.previous(name)
    return [*chain_before(pipeline, previous), previous] if previous else []
