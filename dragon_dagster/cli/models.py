"""Commands on models: generate, score, export to GGUF, the registry's versions and system prompts, the
presets."""

from __future__ import annotations

import time
from pathlib import Path

import click
from rich.table import Table

from .common import console, reach_tracking, resolve_target, runs_dir
from .group import main


@main.command()
@click.argument("target")
@click.argument("prompts", nargs=-1, required=True)
@click.option("--base", is_flag=True, help="Use the base model the target was trained from.")
@click.option("--max-new-tokens", default=128, show_default=True)
@click.option("--temperature", default=0.0, show_default=True, help="0 is greedy.")
@click.option("--system", default=None, help="System prompt.")
def generate(
    target: str, prompts: tuple[str, ...], base: bool, max_new_tokens: int, temperature: float, system: str | None
):
    """Reply to PROMPTS with TARGET: an adapter or merged-model artifact dir, an asset like support/sft_adapter,
    or a registered model like models:/support@champion."""
    from ..engine.infer.generation import generate as generate_replies
    from ..engine.models import load_artifact_model

    model, tokenizer, described = load_artifact_model(resolve_target(target), base=base)
    console.print(f"[dim]{described}[/dim]")
    messages = [
        ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": p}] for p in prompts
    ]
    for prompt, reply in zip(
        prompts, generate_replies(model, tokenizer, messages, max_new_tokens=max_new_tokens, temperature=temperature)
    ):
        console.print(f"[bold]> {prompt}[/bold]\n{reply}\n")


@main.command()
@click.argument("target")
@click.argument("prompt")
@click.argument("replies", nargs=-1, required=True)
@click.option("--system", default=None, help="System prompt.")
def score(target: str, prompt: str, replies: tuple[str, ...], system: str | None):
    """Score REPLIES to PROMPT with the reward model TARGET: a reward_model stage's artifact dir or its asset, like
    support/taste_model. Higher is preferred; the scores rank replies, their scale is the model's own."""
    from ..engine import catalog
    from ..engine.artifacts.manifest import AdapterManifest, read_manifest
    from ..engine.infer.reward_model import load_scorer

    directory = resolve_target(target)
    manifest = read_manifest(directory, AdapterManifest)
    if not catalog.scores_replies(manifest.settings.kind):
        raise click.BadParameter(f"{target!r} is a {manifest.method} adapter, not a reward model")
    scorer = load_scorer(manifest.resolved_model, directory / "adapter")
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    scores = scorer.score([messages] * len(replies), list(replies))
    console.print(f"[dim]reward model {manifest.stage} on {manifest.resolved_model}[/dim]")
    for reply, value in sorted(zip(replies, scores), key=lambda pair: -pair[1]):
        console.print(f"{value:+.3f}  {reply}")


class GGUFFormat(click.Choice):
    """A choice of the export's GGUF formats (gguf_file.FORMATS), read when the option is parsed or shown:
    importing the export when the CLI starts would add about a second to every command."""

    def __init__(self) -> None:
        super().__init__(())

    @property
    def choices(self):
        from ..engine.release.export.gguf_file import FORMATS

        return FORMATS

    @choices.setter
    def choices(self, value) -> None:  # click.Choice.__init__ sets it; the choices are always FORMATS
        pass


@main.command()
@click.argument("target")
@click.option("--ollama", is_flag=True, help="Print the `ollama create` line for the Modelfile.")
@click.option(
    "--out",
    default=None,
    type=click.Path(file_okay=False),
    help="Where to write when TARGET is a model (default: runs/exports/<name>-<time>).",
)
@click.option(
    "--format",
    "formats",
    multiple=True,
    type=GGUFFormat(),
    help="GGUF format(s) to write for a model, each loaded back and its replies compared with the model's "
    "(default: f16 and q8_0).",
)
@click.option("--system", default=None, help="The Modelfile's system prompt, for a model.")
@click.option("--name", default=None, help="Model and file name, for a model (default: its pipeline).")
def export(target: str, ollama: bool, out: str | None, formats: tuple[str, ...], system: str | None, name: str | None):
    """GGUF files of TARGET for llama.cpp and Ollama, with a Modelfile and a model card.

    TARGET: an export artifact or asset (support/gguf_export: its files are listed, nothing is written); or a
    merged model artifact or asset, a models:/NAME@ALIAS, or a model directory, exported now."""
    from ..engine.artifacts.manifest import ExportManifest, manifest_kind, read_manifest
    from ..engine.release.export.model import EXPORT_SUBDIR, export_model

    source = resolve_target(target)
    if manifest_kind(source) == "gguf_export":
        manifest = read_manifest(source, ExportManifest)
        files, command = [f.model_dump() for f in manifest.files], manifest.ollama_create
        export_dir = source / EXPORT_SUBDIR
    else:
        if (
            (source / "config.json").exists()
            and source.name == "model"
            and manifest_kind(source.parent) == "merged_model"
        ):
            source = source.parent  # a registered model read in place: its artifact has the card's facts
        elif target.startswith("models:/") and name is None:  # downloaded: named after the registered model
            name = target[len("models:/") :].split("@")[0].split("/")[0]
        out_dir = (
            Path(out) if out else runs_dir() / "exports" / f"{name or source.name}-{time.strftime('%Y%m%d-%H%M%S')}"
        )
        formats = {"formats": formats} if formats else {}  # none given: the export's DEFAULT_FORMATS
        info = export_model(source, out_dir, system=system, name=name, **formats)
        files, command, export_dir = info["files"], info["ollama_create"], Path(info["export_dir"])
    for f in files:
        a = f.get("agreement")  # the file loaded back against the model (None: exported before verification)
        agreement = (
            f"{a['token_agreement']:>6.1%} tokens, {a['identical_replies']}/{a['prompts']} replies same" if a else ""
        )
        console.print(
            f"{f['format']:>5}  {f['size_mb']:>8.1f} MB  {agreement}  {f['path']}", soft_wrap=True, markup=False
        )
    console.print(f"model card: {export_dir / 'README.md'}", soft_wrap=True, markup=False)
    if ollama:
        if not command:
            raise click.ClickException(f"{target} was exported without a Modelfile (ollama: false)")
        click.echo(command)


@main.command()
@click.argument("pipeline", default="support")
@click.option("--register", "text", default=None, metavar="TEXT", help="Register TEXT as a new version (not live).")
@click.option("--set-live", "version", type=int, default=None, metavar="VERSION", help="Make VERSION the live one.")
def prompt(pipeline: str, text: str | None, version: int | None):
    """PIPELINE's system prompt in MLflow's Prompt Registry: its versions, which one is live (chat, export and
    evaluation send it); --register a new text, --set-live a version."""
    reach_tracking()
    from ..engine.release.model_registry import RegistryError
    from ..engine.release.prompt_registry import LIVE, live_prompt, prompt_name, register_prompt, set_live, versions_of
    from ..resources.tracking import MLflowTracking

    tracking = MLflowTracking()
    client = tracking.client()
    try:
        if text is not None:
            if not text.strip():
                raise click.ClickException("--register: the system prompt is empty")
            made, new = register_prompt(client, pipeline, text, "dragon prompt --register", alias=None)
            click.echo(f"{'registered' if new else 'already registered as'} {made.uri}")
        if version is not None:
            click.echo(f"{set_live(client, pipeline, version).uri} is now {LIVE}")
        live = live_prompt(client, pipeline)
        versions = versions_of(client, pipeline)
    except RegistryError as exc:
        raise click.ClickException(f"{exc} (tracking URI {tracking.shown_uri})") from exc
    if not versions:
        click.echo(
            f"{prompt_name(pipeline)} is not registered yet: building the pipeline's chat dataset registers its "
            "system prompt (or dragon prompt --register TEXT)"
        )
        return
    for v in versions:
        mark = f"  <- {LIVE}" if live and v.version == live.version else ""
        click.echo(f"{v.uri}{mark}\n    {v.text!r}")


@main.command()
@click.argument("pipeline", default="support")
@click.option(
    "--promote",
    "version",
    default=None,
    metavar="VERSION",
    help="Make VERSION the champion (a rollback, say): chat, serve and the next retraining use it.",
)
def models(pipeline: str, version: str | None):
    """PIPELINE's model versions in the MLflow Model Registry, newest first, with their aliases."""
    reach_tracking()
    from ..engine.release.model_registry import CHAMPION
    from ..resources.tracking import MLflowTracking

    tracking = MLflowTracking()
    client = tracking.client()
    if version is not None:
        from ..engine.release.model_registry import ModelRef, version_of

        version_of(client, ModelRef(pipeline, version=version))  # an unknown version fails here, named
        before = tracking.promote(pipeline, version, "promoted by hand (dragon models --promote)")
        click.echo(f"models:/{pipeline}@{CHAMPION} is now version {version} (was {before or 'none'})")
    versions = sorted(client.search_model_versions(f"name = '{pipeline}'"), key=lambda v: -int(v.version))
    if not versions:
        raise click.ClickException(
            f"no registered model {pipeline!r} in {tracking.shown_uri}: materialize a merge first"
        )
    aliases = client.get_registered_model(pipeline).aliases
    table = Table(title=f"models:/{pipeline} in {tracking.shown_uri}")
    for column in ("version", "aliases", "asset", "dagster run", "mlflow run", "created", "artifact"):
        table.add_column(column)
    for v in versions:
        table.add_row(
            str(v.version),
            ", ".join(a for a, n in aliases.items() if str(n) == str(v.version)),
            v.tags.get("asset_key", ""),
            v.tags.get("dagster_run_id", "")[:8],
            (v.run_id or "")[:8],
            time.strftime("%Y-%m-%d %H:%M", time.localtime(v.creation_timestamp / 1000)),
            v.tags.get("artifact_dir", ""),
        )
    console.print(table)


@main.command()
def presets():
    """Small instruct models that work well with LoRA."""
    from ..engine.models import presets_table

    table = Table(title="model presets")
    rows = presets_table()
    for column in rows[0]:
        table.add_column(column)
    for row in rows:
        table.add_row(*[str(v) for v in row.values()])
    console.print(table)
