"""Model cards (README.md with Hugging Face front matter): for the merged model directory, written by the merge,
and for the GGUF export directory, which adds the files, their quantization, the evaluation table and how to
run them.

The facts come from the artifacts' manifests (`card_facts`): the base model and its licence, and for each
adapter stage of the chain its method, settings, dataset and held-out results.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from pydantic import BaseModel

from ..artifacts.manifest import AdapterManifest, ManifestError, read_manifest
from ..config.settings import value_at
from ..models import PRESETS

# Settings that shape the adapter, by their paths of fields (the rest stay in its job.json and MLflow run).
SETTING_KEYS = ("beta", "group_size", "temperature")
LORA_KEYS = ("r", "alpha", "dropout", "target_modules")
ARG_KEYS = ("epochs", "max_steps", "learning_rate", "batch_size", "grad_accum", "max_seq_len")


def license_of(base_model: str, resolved: str | None = None) -> str:
    """The base model's licence: its preset's, else a local model directory README's front matter, else unknown."""
    if base_model in PRESETS:
        return PRESETS[base_model].license
    preset = next((p for p in PRESETS.values() if p.id == base_model), None)
    if preset is not None:
        return preset.license
    for directory in (base_model, resolved):
        readme = Path(directory or "") / "README.md"
        if directory and readme.is_file():
            found = re.search(r"\A---\s*\n(.*?)\n---", readme.read_text(errors="replace"), re.S)
            licence = found and re.search(r"^license:\s*['\"]?([^'\"\n]+?)['\"]?\s*$", found.group(1), re.M)
            if licence:
                return licence.group(1)
    return "unknown"


def hub_id(base_model: str) -> str | None:
    """The base model's Hugging Face id, for `base_model:` (a local directory has none)."""
    if base_model in PRESETS:
        return PRESETS[base_model].id
    if base_model.count("/") == 1 and not base_model.startswith((".", "/", "~")) and not Path(base_model).exists():
        return base_model
    return None


def card_facts(adapters: list[str], resolved_model: str) -> dict:
    """What the cards say, read from the chain's adapter manifests (each adapter dir's parent holds one)."""
    manifests = [read_manifest(Path(a).parent, AdapterManifest) for a in adapters]
    base = next((m.base_model for m in manifests if m.base_model), resolved_model)
    stages = [
        {
            "name": m.stage,
            "method": m.method,
            "dataset": Path(m.dataset).parent.name if m.dataset else "",
            "settings": shown_settings(m.settings),
            "result": flat_result(m.result),
        }
        for m in manifests
    ]
    datasets = []
    for name in dict.fromkeys(s["dataset"] for s in stages if s["dataset"]):  # a combined adapter trained on none
        dataset_dir = next(Path(m.dataset) for m in manifests if Path(m.dataset).parent.name == name)
        datasets.append({"name": name, **dataset_facts(dataset_dir)})
    return {
        "base_model": base,
        "base_model_id": hub_id(base),
        "license": license_of(base, resolved_model),
        "stages": stages,
        "datasets": datasets,
    }


def dataset_facts(directory: Path) -> dict:
    """A dataset artifact's kind, source and row counts, whichever kind of dataset made it."""
    try:
        manifest = read_manifest(directory)
    except ManifestError:
        return {"kind": None, "source": str(directory), "train_rows": None, "eval_rows": None}
    fields = {**(manifest.model_extra or {}).get("result", {}), **manifest.model_dump()}  # made rows: in result
    source = fields.get("source")
    if source and Path(source).is_dir():  # a source snapshot artifact names the file it copied
        source = (read_manifest(source).model_extra or {}).get("source", source)
    if not source and fields.get("dataset"):  # synthesized from an earlier dataset stage
        source = f"the {Path(fields['dataset']).parent.name} stage"
    return {
        "kind": manifest.kind,
        "source": source,
        "train_rows": fields.get("train_rows"),
        "eval_rows": fields.get("eval_rows"),
    }


def shown_settings(settings: BaseModel) -> dict:
    """The settings that shape the adapter, by their paths of fields (a manifest's settings: the kind's model, or
    as recorded)."""
    shown = {key: value_at(settings, key) for key in SETTING_KEYS}
    shown.update({f"lora.{k}": value_at(settings, f"lora.{k}") for k in LORA_KEYS})
    shown.update({k: value_at(settings, f"args.{k}") for k in ARG_KEYS})
    rewards = value_at(settings, "rewards")
    if rewards:
        shown["rewards"] = ", ".join(
            f"{value_at(r, 'name') or value_at(r, 'type')} x{value_at(r, 'weight') or 1}" for r in rewards
        )
    return {k: v for k, v in shown.items() if v is not None}


def flat_result(result) -> dict:
    """A stage's figures on the card: whether they are held out, the training loss, its own held-out figures
    and (SFT) the task metrics of its samples; the rest stay in MLflow."""
    out = {"held_out": result.held_out, **({"train_loss": result.train_loss} if result.train_loss is not None else {})}
    out.update(result.figures)
    metrics = (result.model_extra or {}).get("metrics") or {}
    out.update({f"metrics/{k}": v for k, v in metrics.items() if isinstance(v, (int, float))})
    return out


def front_matter(facts: dict, tags: list[str]) -> str:
    lines = ["---", f"license: {facts.get('license') or 'unknown'}"]
    if facts.get("base_model_id"):
        lines.append(f"base_model: {facts['base_model_id']}")
    lines.append(f"tags: [{', '.join(tags)}]")
    return "\n".join(lines + ["---", ""])


def cell(value) -> str:
    """A figure or setting as a card's table cell: floats to 4 significant digits, lists and mappings as JSON."""
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(", ", ": "))
    return str(value)


def training_section(facts: dict) -> list[str]:
    lines = [
        "## Training",
        "",
        f"Base model: `{facts['base_model']}` (licence: {facts.get('license') or 'unknown'}).",
        "",
    ]
    if not facts.get("stages"):
        return lines + ["No adapter stages are recorded for this model (exported from a plain model directory).", ""]
    lines += [
        "LoRA adapters trained one after the other, each continuing from the one before, folded into the "
        "base model's weights:",
        "",
        "| stage | method | dataset | settings |",
        "|---|---|---|---|",
    ]
    for s in facts.get("stages", []):
        settings = "; ".join(f"{k}: {cell(v)}" for k, v in s["settings"].items())
        lines.append(f"| {s['name']} | {s['method']} | {s['dataset']} | {settings.replace('|', '/')} |")
    if facts.get("datasets"):
        lines += ["", "Datasets:", ""]
        lines += [
            f"- {d['name']} ({d.get('kind') or 'dataset'}): {d.get('train_rows')} training and "
            f"{d.get('eval_rows')} held-out rows, from "
            + (d["source"] if str(d.get("source")).startswith("the ") else f"`{d.get('source')}`")
            for d in facts["datasets"]
        ]
    results = [s for s in facts.get("stages", []) if s["result"]]
    if results:
        keys = list(dict.fromkeys(k for s in results for k in s["result"]))
        lines += [
            "",
            "## Each stage's results (its adapter's own evaluation, held-out rows when `held_out`)",
            "",
            "| stage | " + " | ".join(keys) + " |",
            "|---|" + "---|" * len(keys),
        ]
        lines += [f"| {s['name']} | " + " | ".join(cell(s["result"].get(k, "")) for k in keys) + " |" for s in results]
    return lines + [""]


def merged_card(facts: dict, title: str) -> str:
    return "\n".join(
        [
            front_matter(facts, ["dragon-dagster", "lora", "merged"]),
            f"# {title}",
            "",
            "A standalone model: the adapter chain below merged into its base model. Load it with "
            "`AutoModelForCausalLM.from_pretrained(<this directory>)`.",
            "",
            *training_section(facts),
        ]
    )


def tools_section(tools: list[dict] | None, modelfile_tools: bool | str | None) -> list[str]:
    """The tools the model was trained with (name and the first line of its description) and whether the
    Modelfile renders them: True, or why not (text); None when there is no Modelfile."""
    if not tools:
        return []
    lines = [
        "## Tools",
        "",
        "Trained with these tools (the pipeline's; each call ran and its result came back before the answer):",
        "",
    ]
    for tool in tools:
        description = next((line.strip() for line in str(tool.get("description") or "").splitlines() if line), "")
        lines.append(f"- `{tool['name']}`" + (f": {description}" if description else ""))
    lines.append("")
    if modelfile_tools is True:
        lines += [
            "The Modelfile renders tools as training did: give Ollama's chat API the same tools (`tools`) and the "
            "model's calls come back as `tool_calls`; run them and send each result as a `tool` message.",
            "",
        ]
    elif modelfile_tools:
        lines += [f"The Modelfile carries no tool support: {modelfile_tools}.", ""]
    return lines


def agreement_cells(agreement) -> str:
    """Two table cells: identical replies (n/N) and token agreement (%), or "not verified"."""
    if not agreement:
        return "not verified | not verified"
    a = agreement if isinstance(agreement, dict) else agreement.model_dump()
    return f"{a['identical_replies']}/{a['prompts']} | {a['token_agreement']:.1%}"


def export_card(
    facts: dict,
    title: str,
    files: list[dict],
    ollama_name: str | None,
    system: str | None,
    evaluation: str | None,
    tools: list[dict] | None = None,
    modelfile_tools: bool | str | None = None,
) -> str:
    """files: [{"file", "format", "size_mb", "sha256", "agreement"}] (agreement: verify.py's figures, or None).
    tools, modelfile_tools: see tools_section."""
    # norms and biases stay 32-bit in every format; below 8 bits the output matrix is 8-bit (gguf_file.tensor_type)
    quant = {
        "f16": "16-bit floats: the merged weights, rounded",
        "bf16": "bfloat16: the merged weights with float32's range and fewer digits, as most models are trained",
        "q8_0": "8-bit blocks of 32 weights with a 16-bit scale: about half the size of f16",
        "q5_1": "5-bit blocks of 32 weights with a scale and an offset (the output matrix 8-bit)",
        "q5_0": "5-bit blocks of 32 weights with a scale (the output matrix 8-bit)",
        "q4_1": "4-bit blocks of 32 weights with a scale and an offset (the output matrix 8-bit)",
        "q4_0": "4-bit blocks of 32 weights with a scale (the output matrix 8-bit): the smallest, the furthest from "
        "the model's replies",
    }
    lines = [
        front_matter(facts, ["dragon-dagster", "gguf", "lora", "ollama"]),
        f"# {title} (GGUF)",
        "",
        "The merged model as GGUF files for llama.cpp and Ollama, with its tokenizer and chat template inside.",
        "",
        "## Files",
        "",
        "| file | format | size (MB) | same greedy replies | same reply tokens | sha256 |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {f['file']} | {f['format']} | {f['size_mb']} | {agreement_cells(f.get('agreement'))} | `{f['sha256']}` |"
        for f in files
    ]
    lines += [""] + [f"- {f['format']}: {quant[f['format']]}" for f in files] + [""]
    if any(f.get("agreement") for f in files):
        lines += [
            "Each file was loaded back with transformers and asked the export's fixed prompts greedily: the share "
            "of whole replies identical to the merged model's, and of its reply tokens the file picks too "
            "(fed the model's reply so far).",
            "",
        ]
    lines += ["## Run it", ""]
    if ollama_name:
        lines += [
            "With Ollama (the Modelfile holds the chat template, the stop tokens"
            + (" and the system prompt" if system else "")
            + "):",
            "",
            "```sh",
            f"ollama create {ollama_name} -f Modelfile",
            f"ollama run {ollama_name}",
            "```",
            "",
        ]
    first = files[-1]["file"] if files else "model.gguf"
    lines += [
        "With llama.cpp (the chat template is read from the file):",
        "",
        "```sh",
        f"llama-cli -m {first} -cnv" + (f" -sys {json.dumps(system)}" if system else ""),
        "```",
        "",
    ]
    if system:
        lines += ["System prompt the model was trained with:", "", f"> {system}", ""]
    lines += tools_section(tools, modelfile_tools if ollama_name else None)
    if evaluation:
        lines += ["## Evaluation", "", evaluation, ""]
    return "\n".join(lines + training_section(facts))
