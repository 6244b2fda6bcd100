"""What the studio does when a person acts (`Studio`): inspect a data file, preview the pipeline it drafts, save
it as a component, run it (through the Dagster webserver or a process of the studio), follow and cancel the run,
and open a chat page on the model it made. Each handler returns what the page's components show; the page's
layout and serving are page.py's.
"""

from __future__ import annotations

import os
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

# Before gradio is imported: the page must not phone home (offline machines, privacy of a local model).
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr  # noqa: E402
import pandas as pd  # noqa: E402

from ..engine.artifacts import progress  # noqa: E402
from ..engine.data.checks import blocking_overlap  # noqa: E402
from ..engine.evaluate.plots import plot_stages  # noqa: E402
from ..engine.pipeline import load  # noqa: E402
from ..engine.pipeline.draft import Draft, DraftError, LeakError, Mapping, Recipe, draft, read_data, render, write  # noqa: E402
from ..engine.runs import latest_artifact  # noqa: E402
from ..page_serving import STUDIO_PORT, PageServing  # noqa: E402
from . import run_view  # noqa: E402
from .launch import ENDED, Launched, LocalRun, WebserverRun, webserver_answers  # noqa: E402
from .project import reload_code_locations  # noqa: E402
from .run_view import ended_line, kept_checkpoint, replace_saved, stage_rows, unsaved  # noqa: E402

HEAD_ROWS = 5
SEEN_ROWS = 2  # rows shown whole as the model sees them
STAGE_COLUMNS = ["stage", "status", "seconds", "note"]
LAYOUTS = ["auto", "columns", "messages", "sharegpt", "alpaca"]


def in_users_words(exc: Exception, path: str | None) -> str:
    """An error's text with the uploaded file by its own name, not the folder Gradio keeps it in."""
    text = str(exc)
    return text.replace(f"{Path(path).parent}{os.sep}", "") if path else text


def said(exc: Exception, path: str | None) -> str:
    """An error in the user's words, as a status line."""
    return f"**Error:** {in_users_words(exc, path)}"


def overlap_line(figures: dict) -> str:
    prompts, answers = blocking_overlap(figures)  # what the leak check judges: near-copies, identifying answers
    return f"held-out prompts also in train: **{prompts:.0%}**, answers: **{answers:.0%}**"


@dataclass
class StudioRun:
    """One pipeline run started from the page."""

    name: str
    launched: Launched
    training: list[str]  # its training stages, in the pipeline's order: whose curves the page draws
    assets: list[str]  # the pipeline's assets (pipeline/name): the steps that are stages, not checks
    started: float = field(default_factory=time.time)
    drawn: int = 0  # training points drawn so far
    reported: bool = False  # its end shown: later polls leave the page alone (the status may be the chat's link)


class Studio:
    """The page's handlers: the project's defs folder it writes into, the runs folder its runs write to, how a run is
    made (resources and instance: the defaults of `dragon demo` unless given), the Dagster webserver to launch
    through when it answers (None: always in a process of the studio), and how the studio is served: the chat
    pages it opens are served on its host, behind its login, each on a free port."""

    def __init__(
        self,
        defs_dir: Path,
        runs_dir: Path,
        model: str,
        resources: dict | None = None,
        instance=None,
        dagster_url: str | None = None,
        serving: PageServing | None = None,
    ):
        self.defs_dir, self.runs_dir, self.model = Path(defs_dir), Path(runs_dir), model
        self.resources, self._instance, self.dagster_url = resources, instance, dagster_url
        self.runs: dict[str, StudioRun] = {}
        self.chats: dict[str, tuple[str, object, str]] = {}  # by pipeline: (model directory, the chat app, its URL)
        self.serving = serving or PageServing(port=STUDIO_PORT)

    @property
    def instance(self):
        if self._instance is None:
            from dagster import DagsterInstance

            self._instance = DagsterInstance.get()
        return self._instance

    # ------------------------------------------------------------------------------------------- data

    def inspect(self, path: str | None) -> tuple:
        """Outputs (first rows, the Group by column picker, status beside the upload, then what Preview and Save
        showed: training rows, rendered rows, figures, YAML, their statuses): the file's columns and first rows, or
        why it cannot be read. A new file, a refused one or none clears what the page showed of the one before."""
        cleared = (None, "", "", "", "", "")
        no_columns = gr.update(choices=[], value=None)
        if not path:
            return None, no_columns, "Drop a CSV, JSONL, JSON or Parquet file (up to 50 MB).", *cleared
        try:
            df = read_data(path)
        except DraftError as exc:
            return None, no_columns, said(exc, path), *cleared
        columns = ", ".join(f"`{c}`" for c in df.columns)
        picker = gr.update(choices=[("(none: rows with the same prompt)", "")] + [(c, c) for c in df.columns], value="")
        status = f"{Path(path).name}: {len(df)} rows; columns {columns}. Map them below."
        return df.head(HEAD_ROWS), picker, status, *cleared

    def _draft(
        self,
        path,
        name,
        model,
        layout,
        conversations,
        prompt,
        response,
        system,
        rejected,
        recipe_name,
        steps,
        learning_rate,
        rank,
        tune_steps,
        beta,
        rewards,
        group_by=None,
        allow_leakage=False,
    ) -> Draft:
        if not path:
            raise DraftError("no data file yet: drop one above")
        recipe = Recipe(
            stages=recipe_name,
            max_steps=int(steps),
            learning_rate=float(learning_rate),
            lora_rank=int(rank),
            tune_steps=int(tune_steps),
            beta=float(beta) if beta else None,
            rewards=list(rewards or []),
        )
        mapping = Mapping(prompt, response, system, rejected, layout, conversations, group_by, bool(allow_leakage))
        return draft((name or "").strip(), (model or self.model).strip(), path, mapping, recipe)

    def preview(self, *values) -> tuple:
        """Outputs (training rows, the first ones as the model sees them, figures, YAML, status beside Preview)."""
        try:
            made = self._draft(*values)
            rendered = render(made.attributes["model"], made)
        except LeakError as exc:  # the split's figures stay in view while 'Group by' or 'Allow leakage' change
            return None, "", f"{overlap_line(exc.figures)}.", "", said(exc, values[0])
        except (DraftError, ValueError) as exc:
            return None, "", "", "", said(exc, values[0])
        figures = made.figures
        leaking = any(blocking_overlap(figures))
        allowed = " (allowed: 'Allow leakage' is ticked)" if leaking else ""
        lines = [
            f"**{figures['train_rows']}** training rows, **{figures['eval_rows']}** held out "
            f"({figures['duplicates_dropped']} duplicates dropped); {overlap_line(figures)}{allowed}; "
            f"duplicate share {figures['duplicate_share']:.0%}.",
            self.system_line(made),
            f"Run it from a terminal: `{made.command()}`",
        ]
        seen = "\n".join(f"--- row {i + 1} ---\n{text}" for i, text in enumerate(rendered[:SEEN_ROWS]))
        return (
            pd.DataFrame(made.preview),
            seen,
            "\n\n".join(lines),
            made.yaml,
            "Checked: save it to write the pipeline.",
        )

    @staticmethod
    def system_line(made: Draft) -> str:
        """What the chat on its model will send as the system prompt, and why."""
        spec = made.attributes["stages"][0].get("system")
        if made.system_varies:
            return (
                f"System prompt: `{spec}` differs between rows, so each row trains with its own; the chat on the "
                "model sends none (type one in its system prompt box)."
            )
        if made.system and made.system != spec:
            return f"System prompt: `{spec}` is the same on every row; the chat on the model sends it: {made.system!r}"
        if made.system:
            return f"System prompt: {made.system!r}, on every row and in the chat on the model."
        return "No system prompt in the data (the model's chat template may add its own default, as above)."

    def save(self, *values) -> tuple:
        """Outputs (YAML, status beside Save): the component written, or why not (nothing written then); a running
        Dagster webserver is asked to reload its code location so its UI lists the new pipeline."""
        try:
            made = self._draft(*values)
            path = write(made, self.defs_dir)
        except (DraftError, ValueError) as exc:
            return gr.skip(), said(exc, values[0])
        status = (
            f"Wrote `{path}` (and `{made.data_file.name}` beside it), in the folder the project's code location "
            f"loads: `dg list defs` lists it, `{made.command().split('  ')[0]}` runs it."
        )
        if self.dagster_url and webserver_answers(self.dagster_url):
            reloaded = reload_code_locations(self.dagster_url, f"{made.name}_pipeline")
            status += f" {reloaded[0].upper()}{reloaded[1:]}"
        return made.yaml, status

    # -------------------------------------------------------------------------------------------- run

    def run(self, *values) -> tuple:
        """Run, with the form's values as Save takes them: the saved pipeline's job when the form is what was
        saved; else what differs, with the choice to save the form first or run what was saved. Outputs (the run's
        note, the choice's visibility)."""
        name = (values[1] or "").strip()
        saved = self.defs_dir / name / "defs.yaml"
        if not saved.exists():
            return f"**Error:** no pipeline {name!r} saved in {self.defs_dir}: save it first", gr.update(visible=False)
        try:
            changed = unsaved(self._draft(*values), saved)
        except (DraftError, ValueError) as exc:
            problem = in_users_words(exc, values[0])
            return (
                f"The form has a problem ({problem}): Run would not start what it shows. *Run saved* starts "
                f"`{saved}` as it was saved.",
                gr.update(visible=True),
            )
        if changed:
            return (
                f"**Not saved:** the form differs from `{saved}` in {', '.join(changed)}, and Run starts what was "
                "saved. *Save and run* writes the form over it, then runs it; *Run saved* runs it as it was saved.",
                gr.update(visible=True),
            )
        return self.launch(name), gr.update(visible=False)

    def run_saved(self, name: str) -> tuple:
        """Outputs (the run's note, the choice hidden)."""
        return self.launch(name), gr.update(visible=False)

    def save_and_run(self, *values) -> tuple:
        """The form written over the saved pipeline of its name, then run. Outputs (YAML, the run's note, the
        choice's visibility)."""
        name = (values[1] or "").strip()
        current = self.runs.get(name)
        if current is not None and current.launched.status() not in ENDED:
            return gr.skip(), f"**Error:** {name} is running: cancel it before saving over it", gr.update(visible=True)
        try:
            made = self._draft(*values)
            path = replace_saved(made, self.defs_dir)
        except (DraftError, ValueError) as exc:
            return gr.skip(), said(exc, values[0]), gr.update(visible=True)
        return made.yaml, f"Saved `{path}`. {self.launch(name)}", gr.update(visible=False)

    def launch(self, name: str) -> str:
        """Start the saved pipeline's job; returns the run's note."""
        name = (name or "").strip()
        path = self.defs_dir / name / "defs.yaml"
        if not path.exists():
            return f"**Error:** no pipeline {name!r} saved in {self.defs_dir}: save it first"
        current = self.runs.get(name)
        if current is not None and current.launched.status() not in ENDED:
            return f"{name} is running already (since {time.strftime('%H:%M:%S', time.localtime(current.started))})"
        try:
            pipeline = load(path)
            if self.dagster_url and webserver_answers(self.dagster_url):
                launched = WebserverRun(self.dagster_url, name)
            else:
                launched = LocalRun(path, name, self.instance, self.runs_dir / "studio", self.resources)
        except ValueError as exc:
            return f"**Error:** {exc}"
        training = [s.name for s in pipeline.stages if pipeline.role_of(s) == "training"]
        assets = [f"{name}/{asset}" for asset in [*pipeline.datasets, *(s.name for s in pipeline.stages)]]
        self.runs[name] = StudioRun(name, launched, training, assets)
        return f"Running {name} on {launched.where}: each stage's state and the training curves follow below."

    def cancel(self, name: str) -> str:
        studio_run = self.runs.get((name or "").strip())
        if studio_run is None or studio_run.launched.status() in ENDED:
            return "Nothing of this pipeline is running."
        studio_run.launched.cancel()
        return f"Cancelling {name}: its training stops at the step it is on and keeps its checkpoint."

    def curves(self, name: str) -> list[tuple[str, list[dict]]]:
        """Each training stage's progress rows so far in the current run (stage, rows), from the files the
        workers write (the staging directory while a stage trains, the artifact once it is done)."""
        studio_run = self.runs.get(name)
        if studio_run is None:
            return []
        found = []
        for stage in studio_run.training:  # in the pipeline's order
            stage_dir = self.runs_dir / "artifacts" / name / stage
            files = [p for p in stage_dir.glob("*/progress.jsonl") if p.stat().st_mtime >= studio_run.started]
            if files:
                found.append((stage, progress.read(max(files, key=lambda p: p.stat().st_mtime).parent)))
        return found

    def loss_rows(self, name: str) -> list[dict]:
        """The first training stage's rows with a loss (the SFT stage's, in every recipe)."""
        curves = self.curves(name)
        return [r for r in curves[0][1] if isinstance(r.get("loss"), int | float)] if curves else []

    def curve_plot(self, name: str):
        """The training curves as a PNG (a picture, so the page's content policy needs no script evaluation), or
        gr.skip() while no point came since the last one drawn."""
        curves = self.curves(name)
        points = sum(len(rows) for _, rows in curves)
        studio_run = self.runs[name]
        if points < 2 or points == studio_run.drawn:
            return gr.skip()
        studio_run.drawn = points
        out = Path(tempfile.mkdtemp(prefix="dragon-studio-")) / f"{name}-curves.png"
        return str(plot_stages([(stage, "loss", rows) for stage, rows in curves], out))

    def eta(self, name: str, steps: list) -> str:
        """What the running training stage says it has left (its worker's own estimate), else nothing."""
        running = [s.stage.split("/")[-1] for s in steps if s.status == "RUNNING"]
        rows = dict(self.curves(name)).get(running[0], []) if running else []
        if not rows or not isinstance(rows[-1].get("eta_s"), int | float):
            return ""
        return f" {running[0]}: step {rows[-1]['step']}, about {rows[-1]['eta_s']:.0f} s left in it."

    def links(self, name: str, launched: Launched):
        """Where the run can be looked at: its Dagster run page and its pipeline's MLflow runs, where served."""
        from ..resources.tracking import MLflowTracking

        return run_view.links(launched, name, (self.resources or {}).get("tracking") or MLflowTracking())

    def checkpoints_root(self, pipeline: str, stage: str) -> Path:
        from ..resources.storage import ArtifactStore

        store = (self.resources or {}).get("store") or ArtifactStore(runs_dir=str(self.runs_dir))
        return store.checkpoints_root(pipeline, stage)

    def follow(self, name: str) -> tuple:
        """Outputs (stages, curves, status), polled while the page is open."""
        name = (name or "").strip()
        studio_run = self.runs.get(name)
        if studio_run is None or studio_run.reported:
            return gr.skip(), gr.skip(), gr.skip()
        launched = studio_run.launched
        state, steps = launched.status(), launched.steps()
        rows = stage_rows(
            state,
            steps,
            lambda stage: kept_checkpoint(self.checkpoints_root, launched.run_id, stage),
            studio_run.assets,
        )
        table = pd.DataFrame([{c: getattr(r, c) for c in STAGE_COLUMNS} for r in rows], columns=STAGE_COLUMNS)
        curve = self.curve_plot(name)
        took = time.time() - studio_run.started
        if state not in ENDED:
            doing = {"STARTED": "Running"}.get(state, state.capitalize())
            return table, curve, f"{doing} {name}: {took:.0f} s so far.{self.eta(name, steps)}"
        studio_run.reported = True
        return table, curve, ended_line(name, state, launched, rows, self.links(name, launched))

    # ------------------------------------------------------------------------------------------- chat

    def newest_model(self, pipeline) -> tuple[str, Path] | None:
        """(stage, artifact) of the last model in the pipeline's chain that has been made: the merged model once
        it is, else the latest adapter."""
        found = None
        for stage in pipeline.stages:
            if pipeline.role_of(stage) in ("training", "merge"):
                made = latest_artifact(self.runs_dir, f"{pipeline.name}/{stage.name}")
                found = (stage.name, made) if made is not None else found
        return found

    def chat(self, name: str) -> str:
        """Open the chat page on the pipeline's newest model (its own system prompt, feedback to its store, turns
        traced in its MLflow experiment), on a port of its own; returns the status line with its link."""
        from ..chat_target import chat_target
        from ..chat_ui import serve_target

        name = (name or "").strip()
        if not (self.defs_dir / name / "defs.yaml").exists():
            return f"**Error:** no pipeline {name!r} saved in {self.defs_dir}: save and run it first"
        pipeline = load(self.defs_dir / name / "defs.yaml")
        newest = self.newest_model(pipeline)
        if newest is None:
            return f"**Error:** {name} has no trained model yet: run it first"
        stage, artifact = newest
        open_chat = self.chats.get(name)
        if open_chat is not None and open_chat[0] == str(artifact):
            return f"[Chat with {name}'s {stage}]({open_chat[2]}) (open already)"
        if open_chat is not None:
            open_chat[1].close()
        resources = self.resources or {}
        target = chat_target(
            name,
            str(artifact),
            system=pipeline.system_prompt() or "",
            found=pipeline,
            store=resources.get("store"),
            tracking=resources.get("tracking"),
        )
        # on the studio's host and behind its login; in the background, on a port of its own, on this machine only
        port = free_port(self.serving.host)
        serving = self.serving.model_copy(
            update={"port": port, "block": False, "quiet": True, "share": False, "inbrowser": False}
        )
        made: list = []
        # built in a thread of its own: inside this event Gradio's context names the studio's page, and a page
        # built here would attach its events to it (a thread starts with a fresh context)
        builder = threading.Thread(target=lambda: made.append(serve_target(target, serving, warn=False)))
        builder.start()
        builder.join()
        if not made:
            return f"**Error:** the chat page on {artifact} did not start (the studio's terminal says why)"
        app, url = made[0], f"http://{serving.host}:{serving.port}/"
        self.chats[name] = (str(artifact), app, url)
        dataset = pipeline.system_dataset()
        varies = target.system is None and dataset is not None and dataset.per_row_system(pipeline)
        sends = (
            f"no system prompt (`{dataset.system}` differs between the rows it trained on)"
            if varies
            else target.system_note
        )
        return f"[Chat with {name}'s {stage}]({url}): it sends {sends}; its feedback goes to {target.store.where}."

    def close(self) -> None:
        """Stop the chat pages the studio opened."""
        for _, app, _ in self.chats.values():
            app.close()
        self.chats.clear()


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
