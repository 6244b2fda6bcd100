"""The thin Dagster layer: the pipeline component, asset builders per stage role, checks, automation."""
