"""The export kind's settings: which merged model, which GGUF files, the Ollama Modelfile and its system prompt."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from ...config.stage import Stage
from ...release.export.gguf_file import DEFAULT_FORMATS, FORMATS

GGUFFormat = Literal[FORMATS]  # the choices are gguf_file.FORMATS, so the YAML, its schema and the CLI agree


class Export(Stage):
    """The merged model as GGUF files (llama.cpp, Ollama) with an Ollama Modelfile and a model card."""

    kind: Literal["export"]
    model: str | None = Field(
        None,
        description="The merge stage whose model is exported; default: the pipeline's "
        "merge stage (the last one before this stage).",
    )
    formats: list[GGUFFormat] = Field(
        default_factory=lambda: list(DEFAULT_FORMATS),
        description="GGUF files to write, one a format: f16 or bf16 (the merged weights in 16 bits), q8_0 (8-bit, "
        "half the size), q5_1, q5_0, q4_1, q4_0 (5 and 4 bits in blocks of 32: smaller, and further from the "
        "model's replies). Each file is loaded back and its greedy replies compared with the model's.",
    )
    min_token_agreement: float = Field(
        0.9,
        ge=0.0,
        le=1.0,
        description="The check gguf_replies_agree warns about a file whose greedy reply tokens agree with the "
        "merged model's less often than this (SmolLM2-135M measured: q8_0 0.96, q4_0 0.75; a warning, the file "
        "is written either way).",
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
            raise ValueError(f"export stage {self.name!r}: formats must name at least one of {', '.join(FORMATS)}")
        if len(set(self.formats)) != len(self.formats):
            raise ValueError(f"export stage {self.name!r}: formats lists a format twice: {self.formats}")
        return self

    def reads(self) -> list[str]:
        return [self.model] if self.model else []

    def check_inputs(self, pipeline) -> None:
        """The stage it names must be a merge: it is the model to export."""
        if self.model is None:
            return
        named = pipeline.stage_or_none(self.model)
        if named is None or pipeline.role_of(named) != "merge":
            raise ValueError(
                f"export stage {self.name!r}: model {self.model!r} is a {getattr(named, 'kind', 'source')} stage, "
                "not a merge stage; name the merge stage whose model to export"
            )
