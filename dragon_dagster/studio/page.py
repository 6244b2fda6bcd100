"""The studio's page: from a data file to a trained model in the browser, the way the reference
package's app walks a person through the loop, with the pipeline it makes written as code first.

The page takes a data file (CSV, JSONL, JSON or Parquet, up to 50 MB), shows its columns and first rows, maps
columns or `{column}` templates into prompt, response, system (and rejected, for a pairs file), or reads whole
conversations (messages, ShareGPT, Alpaca: detected as chat_dataset does), and takes a model, a recipe and the few
settings people change. *Preview* checks all of it as a run would (engine/pipeline/draft.py: the stage models, the
dataset asset's own split, leak and quality figures) and shows the training rows through the model's chat
template, the figures (the held-out split's overlap with train among them, shown again as 'Group by' or 'Allow
leakage' change), the component YAML and the command that runs it; a problem shows beside the button that found
it, in the page's words, and nothing is written. *Save* writes `<name>/defs.yaml` with the data file beside it into
the defs folder the project's code location loads (project.py): a normal component, which `dg check yaml` passes,
`dg list defs` lists and `dg launch` runs, and a running Dagster webserver is asked to reload it. *Run* starts its
job through the running Dagster webserver, or in a process of the studio when none answers (launch.py), and the
page follows each stage's state, the training curves as the workers log them and the time left, with *Cancel*;
*Chat* opens the chat page on the newest model the run made.

The page's layout is here (`build_studio`, `start`); what each button does is handlers.py's `Studio`.
"""

from __future__ import annotations

import os

# Before gradio is imported: the page must not phone home (offline machines, privacy of a local model).
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr  # noqa: E402
import pandas as pd  # noqa: E402

from ..engine.models import presets_table  # noqa: E402
from ..engine.pipeline.draft import MAX_BYTES, plain_rewards, recipes  # noqa: E402
from ..page_serving import PageServing, exposed  # noqa: E402
from ..web import serve  # noqa: E402
from .handlers import LAYOUTS, STAGE_COLUMNS, Studio  # noqa: E402

CSS = (
    "#studio_status, #upload_status, #preview_status, #save_status, #run_note {min-height: 2em} "
    "footer {display: none !important}"
)


def exposure_warning(host: str, password: str | None, share: bool = False) -> str | None:
    if not exposed(host, password, share):
        return None
    return (
        f"the studio is served on {host} without a password: anyone who reaches it can write pipelines into the "
        "project and run training. Set one (dragon studio --password-env NAME)."
    )


def build_studio(studio: Studio) -> gr.Blocks:
    described = recipes()
    with gr.Blocks(title="dragon studio") as app:
        gr.Markdown("### From a data file to a trained model")
        status = gr.Markdown(elem_id="studio_status")  # the runs': started, followed, ended, the chat's link
        with gr.Row():
            with gr.Column():
                upload = gr.File(
                    label="Data file (CSV, JSONL, JSON, Parquet; up to 50 MB)",
                    file_types=[".csv", ".jsonl", ".json", ".parquet"],
                    type="filepath",
                    elem_id="data_file",
                )
                upload_status = gr.Markdown("Drop a data file to start.", elem_id="upload_status")
            head = gr.Dataframe(label="First rows", interactive=False, elem_id="head")
        with gr.Row():
            name = gr.Textbox(label="Pipeline name", placeholder="my_pipeline", elem_id="name")
            model = gr.Dropdown(
                choices=list(dict.fromkeys([studio.model, *(p["name"] for p in presets_table())])),
                value=studio.model,
                allow_custom_value=True,  # a hub id or a local directory too
                label="Model (a preset, or type a hub id or a local directory)",
                elem_id="model",
            )
            recipe = gr.Dropdown(
                choices=[(f"{key}: {text}", key) for key, text in described.items()],
                value="supervised",
                label="Recipe",
                elem_id="recipe",
            )
        with gr.Row():
            layout = gr.Dropdown(LAYOUTS, value="auto", label="Layout (auto: detected)", elem_id="layout")
            conversations = gr.Textbox(
                label="Conversations column (messages, sharegpt; default: messages or conversations)",
                elem_id="conversations",
            )
        with gr.Row():
            prompt = gr.Textbox(label="Prompt: a column or a template like {subject}: {body}", elem_id="prompt")
            response = gr.Textbox(
                label="Response: a column or a template (the chosen reply of a pair, GRPO's reference)",
                elem_id="response",
            )
            system = gr.Textbox(label="System prompt (optional; text or a template)", elem_id="system")
            rejected = gr.Textbox(label="Rejected reply (a pairs file only)", elem_id="rejected")
        with gr.Row():
            group_by = gr.Dropdown(
                choices=[],
                value=None,
                label="Group by: rows with the same value stay on one side of the held-out split (none: the same "
                "prompt)",
                elem_id="group_by",
            )
            allow_leakage = gr.Checkbox(
                label="Allow leakage: train even when held-out rows repeat training rows (the check only warns)",
                elem_id="allow_leakage",
            )
        with gr.Row():
            steps = gr.Number(label="SFT steps", value=60, precision=0, minimum=1, elem_id="steps")
            learning_rate = gr.Number(label="Learning rate", value=2.0e-4, elem_id="learning_rate")
            rank = gr.Number(label="LoRA rank", value=16, precision=0, minimum=1, elem_id="rank")
            tune_steps = gr.Number(label="DPO / GRPO steps", value=10, precision=0, minimum=1, elem_id="tune_steps")
            beta = gr.Number(label="DPO / GRPO beta (0: the stage kind's default)", value=0, elem_id="beta")
            rewards = gr.CheckboxGroup(plain_rewards(), value=["contains"], label="GRPO rewards", elem_id="rewards")
        with gr.Row():
            with gr.Column():
                check = gr.Button("Preview", elem_id="preview")
                preview_status = gr.Markdown(elem_id="preview_status")
            with gr.Column():
                save = gr.Button("Save pipeline", variant="primary", elem_id="save")
                save_status = gr.Markdown(elem_id="save_status")
        with gr.Row():
            run = gr.Button("Run", elem_id="run")
            cancel = gr.Button("Cancel", variant="stop", elem_id="cancel")
            talk = gr.Button("Chat with it", elem_id="chat")
        # beside Run: what it started and how it went, and the choice it offers when the form is not what was saved
        run_note = gr.Markdown(elem_id="run_note")
        with gr.Row(visible=False) as offer:
            save_run = gr.Button("Save and run", variant="primary", elem_id="save_and_run")
            run_saved = gr.Button("Run saved", elem_id="run_saved")
        rows = gr.Dataframe(label="Training rows", interactive=False, elem_id="rows")
        seen = gr.Textbox(
            label="The first rows as the model sees them (through its chat template)",
            lines=8,
            max_lines=16,
            interactive=False,
            elem_id="rendered",
        )
        figures = gr.Markdown(elem_id="figures")
        code = gr.Code(label="defs.yaml", language="yaml", interactive=False, elem_id="yaml")
        stages = gr.Dataframe(pd.DataFrame(columns=STAGE_COLUMNS), label="Stages", interactive=False, elem_id="stages")
        curve = gr.Image(label="Training curves", type="filepath", interactive=False, elem_id="loss")
        timer = gr.Timer(2.0)

        values = [upload, name, model, layout, conversations, prompt, response, system, rejected]
        values += [recipe, steps, learning_rate, rank, tune_steps, beta, rewards, group_by, allow_leakage]
        shown = [rows, seen, figures, code]
        upload.change(studio.inspect, [upload], [head, group_by, upload_status, *shown, preview_status, save_status])
        check.click(studio.preview, values, [*shown, preview_status])
        # the split's figures follow the two settings that change it, as they are changed
        group_by.input(studio.preview, values, [*shown, preview_status])
        allow_leakage.input(studio.preview, values, [*shown, preview_status])
        save.click(studio.save, values, [code, save_status])
        run.click(studio.run, values, [run_note, offer])
        save_run.click(studio.save_and_run, values, [code, run_note, offer])
        run_saved.click(studio.run_saved, [name], [run_note, offer])
        cancel.click(studio.cancel, [name], [run_note])
        talk.click(studio.chat, [name], [status])
        timer.tick(studio.follow, [name], [stages, curve, run_note], show_progress="hidden")
    return app


def start(app: gr.Blocks, serving: PageServing) -> str:
    """Serve the studio as `serving` says (web.serve: the offline theme, the security headers, uploads up to
    MAX_BYTES)."""
    warning = exposure_warning(serving.host, serving.password, serving.share)
    return serve(app, CSS, warning, serving, max_file_size=MAX_BYTES)
