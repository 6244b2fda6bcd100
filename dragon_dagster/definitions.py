"""The code location: every pipeline component under defs/, with resources from the environment."""

from pathlib import Path

from dagster import Definitions, load_from_defs_folder

from .assets.pool import POOL_EXECUTOR
from .resources import default_resources

# POOL_EXECUTOR: "Materialize all" runs pooled steps one at a time, as each pipeline's own jobs do
defs = Definitions.merge(
    load_from_defs_folder(path_within_project=Path(__file__).parent),
    Definitions(resources=default_resources(), executor=POOL_EXECUTOR),
)
