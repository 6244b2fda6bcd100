"""The project the studio writes into: the defs folder its code location loads, and the Dagster webserver that
serves it, asked to reload once a pipeline is saved.

The defs folder is found the way the code location finds it: the definitions module of the project in the
current directory (its pyproject's `[tool.dagster] module_name`, else `[tool.dg.project] root_module` +
`.definitions`), then the dg configuration nearest that module (`load_from_defs_folder(path_within_project=...)`
reads the same file) and its `defs_module`. A folder anywhere else would hold pipelines that `dg list defs`, the
Dagster UI and `dg launch` never see, so it is refused with the folder that would be loaded.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from urllib.parse import urlparse

from dagster_shared.utils.config import discover_config_file, get_canonical_defs_module_name, load_toml_as_dict

from ..assets.launch import project_module


class ProjectError(ValueError):
    """No defs folder the running code location loads can be told, or the one asked for is not it."""


def _module_path(module: str, roots: list[Path]) -> Path | None:
    """Where module's source is (a .py file, or a package's folder), under one of roots, else as Python finds it."""
    for root in roots:
        base = root / Path(*module.split("."))
        if base.with_suffix(".py").is_file():
            return base.with_suffix(".py")
        if base.is_dir():
            return base
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(spec.origin) if spec.origin else None


def loaded_defs_dir(cwd: Path | None = None) -> Path:
    """The defs folder the code location of the project in cwd loads (see the module's docstring)."""
    cwd = (cwd or Path.cwd()).resolve()
    module = project_module(cwd)
    found = _module_path(module, [cwd, cwd / "src"])
    if found is None:
        raise ProjectError(
            f"the code location's module {module!r} is not found from {cwd}: run `dragon studio` in your Dagster "
            "project's folder (where its pyproject.toml is)"
        )
    config = discover_config_file(found.parent)
    if config is None:
        raise ProjectError(
            f"{found} is in no dg project (no pyproject.toml with [tool.dg] above it): run `dragon studio` in your "
            "Dagster project's folder (`dg scaffold project`, or the README's setup)"
        )
    toml = load_toml_as_dict(config)
    dg = toml if config.name == "dg.toml" else toml.get("tool", {}).get("dg", {})
    project = dg.get("project", {})
    if not (project.get("defs_module") or project.get("root_module")):
        raise ProjectError(f"{config}: [tool.dg.project] names no root_module (nor defs_module) to load pipelines from")
    defs_module = get_canonical_defs_module_name(project.get("defs_module"), project.get("root_module"))
    root = config.parent
    return (_module_path(defs_module, [root, root / "src"]) or root / Path(*defs_module.split("."))).resolve()


def writable_defs_dir(requested: Path | None = None, cwd: Path | None = None) -> Path:
    """The folder to write pipelines into: the loaded defs folder; `requested` only when it is that folder."""
    loaded = loaded_defs_dir(cwd)
    if requested is not None and Path(requested).resolve() != loaded:
        raise ProjectError(
            f"{requested} is not the folder this project's code location loads, {loaded}: pipelines written there "
            "would be in neither `dg list defs` nor the Dagster UI. Leave --defs out, or run the studio in the "
            "project that loads that folder."
        )
    return loaded


LOCATIONS = "query { workspaceOrError { ... on Workspace { locationEntries { name } } } }"
JOBS = "query { repositoriesOrError { ... on RepositoryConnection { nodes { location { name } jobs { name } } } } }"


def reload_code_locations(url: str, job: str) -> str:
    """Ask the Dagster webserver at url to reload its code locations (GraphQL reloadRepositoryLocation, what the
    UI's Reload button sends) and say whether one of them now has `job`."""
    from dagster_graphql import DagsterGraphQLClient, DagsterGraphQLClientError

    parsed = urlparse(url)
    client = DagsterGraphQLClient(parsed.hostname, port_number=parsed.port, timeout=120)
    try:
        names = [e["name"] for e in client._execute(LOCATIONS)["workspaceOrError"]["locationEntries"]]
        for name in names:
            client.reload_repository_location(name)
        having = {
            node["location"]["name"]
            for node in client._execute(JOBS)["repositoriesOrError"]["nodes"]
            if any(j["name"] == job for j in node["jobs"])
        }
    except (DagsterGraphQLClientError, KeyError) as exc:
        return f"the Dagster webserver at {url} did not reload: {exc}"
    if having:
        return f"the Dagster webserver at {url} reloaded {', '.join(sorted(having))}: its UI lists `{job}`."
    return (
        f"the Dagster webserver at {url} reloaded {', '.join(names) or 'no code location'} and has no `{job}`: it "
        "serves another project than this one."
    )
