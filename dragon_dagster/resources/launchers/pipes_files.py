"""A subprocess worker's Dagster Pipes files in a folder its run owns: <runs>/.pipes/<run_id>/<step>-<nonce>/.

Dagster's PipesTempFileContextInjector and PipesTempFileMessageReader put them in a folder of the system temp
directory that only a step which ends can remove: a step killed -9 (or its whole Dagster) left it there for good.
Here the step removes its folder when its Pipes session closes, and ArtifactStore.clean_stale_pipes removes the
folders of runs that are over.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dagster import PipesFileContextInjector, PipesFileMessageReader

from ...engine.artifacts.directories import remove_tree
from ..storage import ArtifactStore

logger = logging.getLogger(__name__)

CONTEXT_FILE, MESSAGES_FILE = "context", "messages"


class StepPipesFiles:
    """The context injector and the message reader for one worker of a step, their files in one fresh folder:
    pass both to open_pipes_session."""

    def __init__(self, context):
        op = context.op_execution_context
        self.folder = store_of(context).new_pipes_dir(op.run_id, op.get_step_execution_context().step.key)
        self.injector = FolderContextInjector(self.folder)
        self.reader = PipesFileMessageReader(str(self.folder / MESSAGES_FILE))


def store_of(context) -> ArtifactStore:
    """The step's ArtifactStore (each asset that runs a worker has one, as `store`), so that the folder is in the
    runs directory its cleanup reads; without one, the store of the default runs directory."""
    store = getattr(getattr(context, "resources", None), "store", None)
    return store if isinstance(store, ArtifactStore) else ArtifactStore()


class FolderContextInjector(PipesFileContextInjector):
    """PipesFileContextInjector that makes its folder (private to this user) as the session opens and removes
    it, with the message file beside the context file, as the session closes.

    open_pipes_session enters the injector before the message reader and leaves it after the reader is done,
    so the folder is there for the whole session and removed last.
    """

    def __init__(self, folder: Path):
        super().__init__(str(folder / CONTEXT_FILE))
        self.folder = folder

    @contextmanager
    def inject_context(self, context_data) -> Iterator[dict]:
        self.folder.mkdir(mode=0o700, parents=True)
        try:
            with super().inject_context(context_data) as params:
                yield params
        finally:
            try:
                remove_tree(self.folder)
            except OSError as exc:  # never fails the step over it: the cleanup removes it once the run is over
                logger.warning(f"could not remove the Pipes folder {self.folder}: {exc}")
            try:  # the run's folder too, once its last step's is gone: a normal run leaves nothing
                self.folder.parent.rmdir()
            except OSError:  # another step of the run still has its folder there
                pass
