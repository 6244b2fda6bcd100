"""`dragon studio`: from a data file to a trained model in the browser, the way the reference package's app walks
a person through the loop, with the pipeline it makes written as code first.

The page takes a data file (CSV, JSONL, JSON or Parquet, up to 50 MB), shows its columns and first rows, maps
columns or `{column}` templates into prompt, response and system, and takes a model and the few SFT settings
people change. *Preview* checks all of it as a run would (engine/pipeline/draft.py: the stage models, the dataset
asset's own split, leak and quality figures) and shows the training rows, the figures, the component YAML and the
command that runs it; a problem shows where it was made, in the stage models' words, and nothing is written.
*Save* writes `defs/<name>/defs.yaml` with the data file beside it: a normal component, which `dg check yaml`
passes and `dg dev` lists. *Run* materializes its job in this process (a background thread, on the Dagster
instance of $DAGSTER_HOME, so the run is in the Dagster UI too) while the page follows each stage's state and the
loss curve (a picture, redrawn as the worker logs it); when the run ends, it says how to talk to the result.

It is served like the chat page (web.py: the same security headers, the same login), and as the chat page, it
warns when served beyond this machine without a password: it writes files and runs training.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

# Before gradio is imported: the page must not phone home (offline machines, privacy of a local model).
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr  # noqa: E402
import pandas as pd  # noqa: E402

from .engine.artifacts import progress  # noqa: E402
from .engine.evaluate.plots import plot_loss  # noqa: E402
from .engine.pipeline import load  # noqa: E402
from .engine.pipeline.draft import MAX_BYTES, Draft, DraftError, Recipe, draft, read_data, write  # noqa: E402
from .web import USERNAME, is_loopback, serve  # noqa: E402

CSS = "#studio_status {min-height: 2em} footer {display: none !important}"
HEAD_ROWS = 5


def exposure_warning(host: str, password: str | None, share: bool = False) -> str | None:
    if password or (is_loopback(host) and not share):
        return None
    return (
        f"the studio is served on {host} without a password: anyone who reaches it can write pipelines into the "
        "project and run training. Set one (dragon studio --password-env NAME)."
    )


@dataclass
class StudioRun:
    """One pipeline run started from the page, in a thread of this process."""

    name: str
    started: float = field(default_factory=time.time)
    outcome: dict | None = None
    error: str | None = None
    thread: threading.Thread | None = None

    @property
    def done(self) -> bool:
        return self.outcome is not None or self.error is not None


class Studio:
    """The page's handlers: the project's defs folder it writes into, the runs folder its runs write to, and how a
    run is made (resources and instance: the defaults of `dragon demo` unless given)."""

    def __init__(self, defs_dir: Path, runs_dir: Path, model: str, resources: dict | None = None, instance=None):
        self.defs_dir, self.runs_dir, self.model = Path(defs_dir), Path(runs_dir), model
        self.resources, self.instance = resources, instance
        self.runs: dict[str, StudioRun] = {}
        self.drawn: dict[str, int] = {}  # loss points drawn so far, by pipeline

    # ------------------------------------------------------------------------------------------- data

    def inspect(self, path: str | None) -> tuple:
        """Outputs (first rows, status): the file's columns and first rows, or why it cannot be read."""
        if not path:
            return gr.skip(), "Drop a CSV, JSONL, JSON or Parquet file (up to 50 MB)."
        try:
            df = read_data(path)
        except DraftError as exc:
            return None, f"**Error:** {exc}"
        columns = ", ".join(f"`{c}`" for c in df.columns)
        return df.head(HEAD_ROWS), f"{Path(path).name}: {len(df)} rows; columns {columns}. Map them below."

    def _draft(self, path, name, model, prompt, response, system, steps, learning_rate, rank) -> Draft:
        if not path:
            raise DraftError("no data file yet: drop one above")
        recipe = Recipe(max_steps=int(steps), learning_rate=float(learning_rate), lora_rank=int(rank))
        return draft(
            (name or "").strip(),
            (model or self.model).strip(),
            path,
            prompt or "",
            response or "",
            (system or "").strip() or None,
            recipe,
        )

    def preview(self, *values) -> tuple:
        """Outputs (training rows, figures, YAML, status)."""
        try:
            made = self._draft(*values)
        except (DraftError, ValueError) as exc:
            return None, "", "", f"**Error:** {exc}"
        figures = made.figures
        lines = [
            f"**{figures['train_rows']}** training rows, **{figures['eval_rows']}** held out "
            f"({figures['duplicates_dropped']} duplicates dropped); held-out prompts also in train: "
            f"{figures['prompt_overlap']:.0%}, answers: {figures['answer_overlap']:.0%}; "
            f"duplicate share {figures['duplicate_share']:.0%}.",
            f"Run it from a terminal: `{made.command()}`",
        ]
        return pd.DataFrame(made.preview), "\n\n".join(lines), made.yaml, "Checked: save it to write the pipeline."

    def save(self, *values) -> tuple:
        """Outputs (YAML, status): the component written, or why not (nothing written then)."""
        try:
            made = self._draft(*values)
            path = write(made, self.defs_dir)
        except (DraftError, ValueError) as exc:
            return gr.skip(), f"**Error:** {exc}"
        return made.yaml, f"Wrote `{path}` (and `{made.data_file.name}` beside it). `dg check yaml` checks it."

    # -------------------------------------------------------------------------------------------- run

    def run(self, name: str) -> str:
        """Start the saved pipeline's job in a thread; returns the status line."""
        name = (name or "").strip()
        path = self.defs_dir / name / "defs.yaml"
        if not path.exists():
            return f"**Error:** no pipeline {name!r} saved in {self.defs_dir}: save it first"
        current = self.runs.get(name)
        if current is not None and not current.done:
            return f"{name} is running already (since {time.strftime('%H:%M:%S', time.localtime(current.started))})"
        try:
            pipeline = load(path)
        except ValueError as exc:
            return f"**Error:** {exc}"
        studio_run = self.runs[name] = StudioRun(name)

        def work():
            from .assets.launch import materialize_pipeline

            try:
                studio_run.outcome = materialize_pipeline(
                    pipeline, profile=None, resources=self.resources, instance=self.instance
                )
            except Exception as exc:  # noqa: BLE001 - shown on the page
                studio_run.error = f"{type(exc).__name__}: {exc}"

        studio_run.thread = threading.Thread(target=work, name=f"studio-{name}", daemon=True)
        studio_run.thread.start()
        return f"Running {name}: each stage's state and the loss curve follow below."

    def loss_rows(self, name: str) -> list[dict]:
        """The SFT stage's progress rows with a loss, from the file its worker writes (the staging directory while
        it trains, the artifact once it is done), the newest found."""
        stage_dir = self.runs_dir / "artifacts" / name / "sft_adapter"
        found = stage_dir.glob("*/progress.jsonl") if stage_dir.is_dir() else []
        files = sorted(found, key=lambda p: p.stat().st_mtime)
        rows = progress.read(files[-1].parent) if files else []
        return [r for r in rows if isinstance(r.get("loss"), int | float)]

    def loss_plot(self, name: str):
        """The loss curve as a PNG (a picture, so the page's content policy needs no script evaluation), or
        gr.skip() while it has no new point since the last one drawn."""
        rows = self.loss_rows(name)
        if len(rows) < 2 or self.drawn.get(name) == len(rows):
            return gr.skip()
        self.drawn[name] = len(rows)
        out = Path(tempfile.mkdtemp(prefix="dragon-studio-")) / f"{name}-loss.png"
        return str(plot_loss(rows, out, title=f"{name}: SFT loss"))

    def links(self, name: str, run_id: str) -> str:
        """Where the run is in the Dagster UI and its pipeline's runs in MLflow (the addresses `make ui` serves)."""
        from .resources.tracking import MLflowTracking, dagster_ui_url

        tracking = (self.resources or {}).get("tracking") or MLflowTracking()
        return f"[the run in Dagster]({dagster_ui_url()}/runs/{run_id}), [its MLflow runs]({tracking.runs_url(name)})"

    def follow(self, name: str) -> tuple:
        """Outputs (stages, loss curve, status), polled while the page is open."""
        name = (name or "").strip()
        studio_run = self.runs.get(name)
        if studio_run is None:
            return gr.skip(), gr.skip(), gr.skip()
        curve = self.loss_plot(name)
        if studio_run.error:
            return gr.skip(), curve, f"**Error:** the run failed: {studio_run.error}"
        if studio_run.outcome is None:
            took = time.time() - studio_run.started
            return gr.skip(), curve, f"Running {name}: {took:.0f} s so far."
        outcome = studio_run.outcome
        table = pd.DataFrame(
            [{"stage": s["asset"], "seconds": round(s["seconds"], 1), "status": s["status"]} for s in outcome["stages"]]
        )
        links = self.links(name, outcome["run_id"])
        if outcome["success"]:
            status = (
                f"**SUCCESS**: Dagster run `{outcome['run_id']}` ({links}). Talk to the result: "
                f"`dragon chat-ui {name}` (or `dragon chat {name}` in a terminal)."
            )
        else:
            failed = [s["asset"] for s in outcome["stages"] if s["status"] not in ("SUCCESS", "NOT RUN")]
            status = (
                f"**FAILURE**: Dagster run `{outcome['run_id']}` failed at {', '.join(failed) or 'a check'} ({links})."
            )
        return table, curve, status


def build_studio(studio: Studio) -> gr.Blocks:
    with gr.Blocks(title="dragon studio") as app:
        gr.Markdown("### From a data file to a trained model")
        status = gr.Markdown("Drop a data file to start.", elem_id="studio_status")
        with gr.Row():
            upload = gr.File(
                label="Data file (CSV, JSONL, JSON, Parquet; up to 50 MB)",
                file_types=[".csv", ".jsonl", ".json", ".parquet"],
                type="filepath",
                elem_id="data_file",
            )
            head = gr.Dataframe(label="First rows", interactive=False, elem_id="head")
        with gr.Row():
            name = gr.Textbox(label="Pipeline name", placeholder="my_pipeline", elem_id="name")
            model = gr.Textbox(
                label="Model (a preset, a hub id or a local directory)", value=studio.model, elem_id="model"
            )
        with gr.Row():
            prompt = gr.Textbox(label="Prompt: a column or a template like {subject}: {body}", elem_id="prompt")
            response = gr.Textbox(label="Response: a column or a template", elem_id="response")
            system = gr.Textbox(label="System prompt (optional; text or a template)", elem_id="system")
        with gr.Row():
            steps = gr.Number(label="SFT steps", value=60, precision=0, minimum=1, elem_id="steps")
            learning_rate = gr.Number(label="Learning rate", value=2.0e-4, elem_id="learning_rate")
            rank = gr.Number(label="LoRA rank", value=16, precision=0, minimum=1, elem_id="rank")
        with gr.Row():
            check = gr.Button("Preview", elem_id="preview")
            save = gr.Button("Save pipeline", variant="primary", elem_id="save")
            run = gr.Button("Run", elem_id="run")
        rows = gr.Dataframe(label="Training rows as the model will see them", interactive=False, elem_id="rows")
        figures = gr.Markdown(elem_id="figures")
        code = gr.Code(label="defs.yaml", language="yaml", interactive=False, elem_id="yaml")
        stages = gr.Dataframe(label="Stages", interactive=False, elem_id="stages")
        curve = gr.Image(label="SFT loss", type="filepath", interactive=False, elem_id="loss")
        timer = gr.Timer(2.0)

        values = [upload, name, model, prompt, response, system, steps, learning_rate, rank]
        upload.change(studio.inspect, [upload], [head, status])
        check.click(studio.preview, values, [rows, figures, code, status])
        save.click(studio.save, values, [code, status])
        run.click(studio.run, [name], [status])
        timer.tick(studio.follow, [name], [stages, curve, status], show_progress="hidden")
    return app


def start(
    app: gr.Blocks,
    host: str = "127.0.0.1",
    port: int = 7861,
    block: bool = True,
    quiet: bool = False,
    password: str | None = None,
    username: str = USERNAME,
) -> str:
    """Serve the studio (web.serve: the offline theme, the security headers, uploads up to MAX_BYTES)."""
    return serve(
        app,
        CSS,
        exposure_warning(host, password),
        host=host,
        port=port,
        block=block,
        quiet=quiet,
        password=password,
        username=username,
        max_file_size=MAX_BYTES,
    )
