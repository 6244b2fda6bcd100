"""The export: a merged model (its artifact directory, or any transformers model directory) to GGUF files, an
Ollama Modelfile and a model card in one directory. `export_model` is the whole of it; the `export` stage kind's
worker (stages/export/) runs it into `<artifact>/gguf/`.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from ... import models
from ...artifacts.directories import sha256
from ...artifacts.manifest import MergedManifest, manifest_kind, read_manifest
from ...config.reporter import Reporter
from .. import card
from . import chat_template, ollama, tool_template
from .errors import ExportError
from .gguf_file import DEFAULT_FORMATS, FORMATS, architecture_of, read_config, write_gguf

EXPORT_SUBDIR = "gguf"  # in an export stage's artifact, beside its manifest and job file


def model_source(model_dir: str | Path) -> tuple[Path, dict, str]:
    """(weights directory, card facts, default name) for a merged-model artifact or a plain model directory."""
    model_dir = Path(model_dir)
    if manifest_kind(model_dir) == "merged_model":
        manifest = read_manifest(model_dir, MergedManifest)
        facts = manifest.info.card or card.card_facts(manifest.adapters, manifest.resolved_model)
        # an artifact lives at <runs>/artifacts/<pipeline>/<stage>/<run>: the pipeline names the model
        return model_dir / "model", facts, model_dir.parent.parent.name
    if not (model_dir / "config.json").exists():
        raise ExportError(f"{model_dir} is neither a merged-model artifact nor a model directory (no config.json)")
    # the embedded model's converted cache is the preset (its licence and hub id), not an anonymous directory
    embedded = model_dir.resolve() == (models.cache_dir() / models.EMBEDDED).resolve()
    base = models.EMBEDDED if embedded else read_config(model_dir).get("_name_or_path") or str(model_dir)
    facts = {
        "base_model": base,
        "base_model_id": card.hub_id(base),
        "license": card.license_of(base, str(model_dir)),
        "stages": [],
        "datasets": [],
    }
    return model_dir, facts, model_dir.name


def slug(name: str) -> str:
    """A name usable in file names and as an Ollama model name."""
    out = re.sub(r"[^a-z0-9._-]+", "-", name.lower()).strip("-.")
    if not out:
        raise ExportError(f"cannot make a model name out of {name!r}; give one with letters or digits")
    return out


def export_model(
    model_dir: str | Path,
    out_dir: str | Path,
    formats: tuple[str, ...] | list[str] = DEFAULT_FORMATS,
    system: str | None = None,
    name: str | None = None,
    ollama_files: bool = True,
    evaluation: str | None = None,
    reporter: Reporter | None = None,
    tools: list[dict] | None = None,
    verify: bool = True,
) -> dict:
    """Write <name>-<format>.gguf for each format, a Modelfile (ollama_files) and README.md into out_dir.

    model_dir: a merged-model artifact directory (its manifest gives the card's facts) or a model directory.
    system: the Modelfile's SYSTEM and the card's system prompt. name: general.name, the file names and the
    Ollama model name (default: the pipeline of the artifact, or the directory's name). evaluation: a markdown
    table for the card (the evaluate kind's ReportResult.card_table()). tools: the tools the model was trained
    with, [{"name", "description"}], for the card; the Modelfile renders tools whenever the chat template does
    in a form it can say (tool_template.py), and the card says whether it does. verify: load each file back
    and record how often its greedy replies are the model's (verify.py; its "agreement", else None).
    Returns {"export_dir", "name", "architecture", "files": [{"file", "format", "path", "size_bytes",
    "size_mb", "sha256", "seconds", "agreement"}], "modelfile", "ollama_create", "stop", "system", "tools",
    "modelfile_tools", "modelfile_tools_note", "card", "seconds"}.
    """
    started = time.perf_counter()
    formats = list(dict.fromkeys(formats))
    unknown = [f for f in formats if f not in FORMATS]
    if unknown or not formats:
        raise ExportError(f"unknown GGUF format(s) {unknown or formats}; known: {', '.join(FORMATS)}")
    weights_dir, facts, default_name = model_source(model_dir)
    config = read_config(weights_dir)
    architecture = architecture_of(config).gguf_arch  # refuses an unsupported model before any work
    name = slug(name or default_name)
    segments = stops = tool_segments = no_tools = None
    if ollama_files:  # the template is checked before the slow part, so a bad one fails fast
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(weights_dir))
        segments = chat_template.derive(tokenizer)
        stops = chat_template.stop_tokens(tokenizer, segments)
        tool_segments, no_tools = tool_template.tool_support(tokenizer, segments)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    general = {
        "name": name,
        "license": facts.get("license"),
        "base_model": facts.get("base_model"),
        "base_model_repo": facts.get("base_model_id"),
    }
    verifier = None
    if verify:
        from .verify import Verifier

        verifier = Verifier(weights_dir)  # the model's own replies, once for all the files
    files = []
    for fmt in formats:
        t0 = time.perf_counter()
        path = out / f"{name}-{fmt}.gguf"
        write_gguf(weights_dir, path, fmt, general)
        size = path.stat().st_size
        files.append(
            {
                "file": path.name,
                "format": fmt,
                "path": str(path),
                "size_bytes": size,
                "size_mb": round(size / 1e6, 1),
                "sha256": sha256(path),
                "seconds": round(time.perf_counter() - t0, 2),
                "agreement": None,
            }
        )
        if reporter:
            reporter.log(f"wrote {path.name}: {size / 1e6:.1f} MB in {files[-1]['seconds']} s")
        if verifier is not None:
            agreement = files[-1]["agreement"] = verifier.agreement(path)
            if reporter:
                reporter.log(
                    f"{path.name} reloaded: {agreement['identical_replies']}/{agreement['prompts']} greedy replies "
                    f"identical to the model's, {agreement['token_agreement']:.1%} of its reply tokens the same"
                )
    modelfile = command = None
    if ollama_files:
        # q8_0 when there is one: half the size of f16, and the same replies nearly always
        chosen = next((f for f in files if f["format"] == "q8_0"), files[0])
        modelfile = str(ollama.write_modelfile(out, chosen["file"], segments, stops, system, tool_segments))
        command = ollama.create_command(out, name)
    readme = out / "README.md"
    readme.write_text(
        card.export_card(
            facts,
            name,
            files,
            name if ollama_files else None,
            system,
            evaluation,
            tools=tools,
            modelfile_tools=no_tools if tool_segments is None else True,
        )
    )
    return {
        "export_dir": str(out),
        "name": name,
        "architecture": architecture,
        "files": files,
        "modelfile": modelfile,
        "ollama_create": command,
        "stop": stops or [],
        "system": system,
        "tools": list(tools or []),
        "modelfile_tools": tool_segments is not None,
        "modelfile_tools_note": no_tools,
        "card": str(readme),
        "seconds": round(time.perf_counter() - started, 2),
    }
