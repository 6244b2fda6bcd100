"""A stage kind lives in its own folder: outside it, only the catalog (its one registration line) names it. Generic
modules ask the catalog and the kind's hooks instead of branching on its name: no string equal to a kind's name,
no import of a kind's folder, no `isinstance` against a kind's settings model.

Three named exceptions: the feedback retraining (its settings, objectives table and rows) is a fixed pipeline of its
kinds, whose YAML names them as its objectives (`objectives: [sft, dpo, kto, rlhf]`, rlhf being a reward model and
GRPO); the reward type `reward_model` (engine/rewards/learned.py), named after the kind whose model it
loads, as the issue and the YAML call it; and the merge_adapters, merge,
evaluate and export kinds share their names with their roles, which the Dagster layer builds assets by.
"""

import ast
from pathlib import Path

import dragon_dagster
from dragon_dagster.engine import catalog

PACKAGE = Path(dragon_dagster.__file__).parent
ROLE_NAMED = {name for name, kind in catalog.KINDS.items() if name == kind.role}  # merge, merge_adapters ...: roles
RETRAINING = {"engine/pipeline/retraining.py", "engine/pipeline/objectives.py", "engine/data/feedback_rows.py"}
RETRAINING_KINDS = {"sft", "dpo", "kto", "orpo", "reward_model", "grpo"}
# a reward type named after the kind it loads, and the gate's taste that picks the rewards of that type
SAME_NAMED = {"engine/rewards/learned.py": {"reward_model"}, "assets/feedback_taste.py": {"reward_model"}}


def generic_modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith("engine/stages/") or rel == "engine/catalog.py":
            continue
        yield rel, ast.parse(path.read_text())


def test_no_generic_module_names_a_kind():
    kinds = set(catalog.KINDS) - ROLE_NAMED
    settings_classes = {kind.settings.__name__ for kind in catalog.KINDS.values()}
    found = []
    for rel, tree in generic_modules():
        allowed = (RETRAINING_KINDS if rel in RETRAINING else set()) | SAME_NAMED.get(rel, set())
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in kinds - allowed:
                found.append(f"{rel}:{node.lineno} names the kind {node.value!r}")
            elif isinstance(node, ast.ImportFrom) and node.module and ".stages." in f".{node.module}.":
                kind = node.module.split("stages.")[-1].split(".")[0]
                if kind in kinds - allowed:
                    found.append(f"{rel}:{node.lineno} imports the {kind} kind's folder")
            elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2:
                names = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
                names |= {n.attr for n in ast.walk(node.args[1]) if isinstance(n, ast.Attribute)}
                if names & settings_classes:
                    found.append(f"{rel}:{node.lineno} branches on a kind's settings model {names & settings_classes}")
            elif (
                isinstance(node, ast.Compare)
                and any(
                    isinstance(side, ast.Attribute) and side.attr == "kind" for side in [node.left, *node.comparators]
                )
                and any(isinstance(c, ast.Constant) and isinstance(c.value, str) for c in ast.walk(node))
            ):
                found.append(f"{rel}:{node.lineno} compares a stage's kind with a name")
    assert not found, "\n".join(found)


def test_each_kind_is_one_folder_and_one_registration():
    registered = (PACKAGE / "engine" / "catalog.py").read_text()
    for name, kind in catalog.KINDS.items():
        folder = PACKAGE / "engine" / "stages" / name
        assert folder.is_dir() and (folder / "__init__.py").exists(), name
        assert kind.settings.__module__.startswith(f"dragon_dagster.engine.stages.{name}."), name
        assert f'    "{name}",\n' in registered or not name.isidentifier(), name  # its line in BUILT_IN


def test_every_kind_folder_is_registered_by_its_one_line():
    """A stage kind is a folder of engine/stages/ and one line of the catalog's BUILT_IN: nothing else to edit."""
    folders = sorted(p.parent.name for p in (PACKAGE / "engine" / "stages").glob("*/__init__.py"))
    assert sorted(catalog.BUILT_IN) == folders
    assert all(catalog.KINDS[folder].module.startswith(f"dragon_dagster.engine.stages.{folder}") for folder in folders)
    lines = (PACKAGE / "engine" / "catalog.py").read_text().splitlines()
    assert all(lines.count(f'    "{folder}",') == 1 for folder in folders)  # one line each
