"""docs/architecture.md is the map of the tree: every module of the package is named on it (a stage kind's own
files excepted: their folder is the kind, and the page says what every kind folder holds), and every folder it
names under dragon_dagster/ exists."""

import re
from pathlib import Path

import dragon_dagster

PACKAGE = Path(dragon_dagster.__file__).parent
DOC = (PACKAGE.parent / "docs" / "architecture.md").read_text()


def test_every_module_is_on_the_map():
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if path.name in ("__init__.py", "__main__.py") or rel.parts[:2] == ("engine", "stages") and len(rel.parts) > 3:
            continue
        if not re.search(rf"(?<![\w.]){re.escape(path.name)}\b", DOC):
            missing.append(rel.as_posix())
    assert not missing, f"docs/architecture.md does not name {missing}: add them where they sit in its layout"


def layout_entries() -> dict[str, str]:
    """The Layout picture's entries (a folder or a module at the start of a line, indented by its depth), each with
    the text beside and under it, by path: `dragon_dagster/engine/data` -> "tables.py (tables read, ...), ..."."""
    picture = DOC.split("## Layout", 1)[1].split("```", 2)[1]
    entries: dict[str, str] = {}
    path: list[str] = []
    current = None
    for line in picture.splitlines():
        indent = len(line) - len(line.lstrip())
        name = line.split()[0] if line.strip() else ""
        if name and indent % 2 == 0 and indent <= 4 and re.fullmatch(r"[\w.]+/?", name):
            path = [*path[: indent // 2], name.rstrip("/")]
            current = "/".join(path)
            entries[current] = line[indent + len(name) :]
        elif current is not None:
            entries[current] += " " + line.strip()
    return entries


def test_every_module_is_placed_in_its_folder():
    """Named where it sits, not only somewhere: a module is described in the Layout entry of its nearest folder
    that has one (the Dagster layer's modules in that layer's table), so a moved module moves on the map."""
    entries = layout_entries()
    dagster_layer = DOC.split("## The Dagster layer", 1)[1].split("\n## ", 1)[0]
    misplaced = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent)
        if path.name in ("__init__.py", "__main__.py") or rel.parts[1:3] == ("engine", "stages") and len(rel.parts) > 4:
            continue
        if rel.as_posix() in entries:
            continue
        home = next(p.as_posix() for p in rel.parents if p.as_posix() in entries)
        text = dagster_layer if "the table above" in entries[home] else entries[home]
        if not re.search(rf"(?<![\w.]){re.escape(path.name)}\b", text):
            misplaced.append(f"{rel.as_posix()} (not under {home}/)")
    assert not misplaced, f"docs/architecture.md's Layout does not place {misplaced}: name each in its folder's entry"


def test_every_kind_folder_and_named_folder_exists():
    layout = DOC.split("## Layout", 1)[1]
    kinds = sorted(p.parent.name for p in (PACKAGE / "engine" / "stages").glob("*/__init__.py"))
    listed = layout.split("stages/", 1)[1].split("train/", 1)[0].split(":", 1)[1].split()
    assert sorted(listed) == kinds
    folders = re.findall(r"^ {2,4}(\w+)/ ", layout, flags=re.M)
    assert all(any(PACKAGE.rglob(folder)) for folder in folders), folders


def test_the_import_contracts_place_every_module():
    """Each layers contract names every module of its container (and the package's contract every top-level
    module): a module left out of the layers is free to import anything, so the stack would not hold for it."""
    import tomllib

    contracts = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    unplaced = []
    for contract in (c for c in contracts if c["type"] == "layers"):
        named = {m.strip() for layer in contract["layers"] for m in layer.split("|")}
        for container in contract.get("containers", ["dragon_dagster"]):
            folder = PACKAGE.parent / container.replace(".", "/")
            children = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
            children |= {p.parent.name for p in folder.glob("*/__init__.py")}
            prefix = "" if "containers" in contract else f"{container}."
            placed = {n.removeprefix(prefix) for n in named}
            unplaced += [f"{container}.{c}" for c in sorted(children - placed - {"__main__"})]
    assert not unplaced, f"modules no import contract places: {unplaced}"


def test_no_module_imports_the_package_that_imports_it():
    """import-linter's acyclic_siblings contract finds circles between siblings; this finds the ones it cannot, a
    package and a module inside it importing each other (a module reading a name from its package's __init__,
    which imports the module): whichever is imported first sees the other half-built. Function-level imports
    count, since they are the usual way such a circle is hidden."""
    import ast

    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.with_suffix("").relative_to(PACKAGE.parent).parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    imports: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = imports.setdefault(name, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names if alias.name in modules}
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                source = ".".join([*base, node.module] if node.module else base)
                for alias in node.names:  # `from . import x` imports the module x where there is one
                    target = f"{source}.{alias.name}"
                    found.add(target if target in modules else source)
    circles = [
        f"{inner} <-> {outer}"
        for inner, targets in imports.items()
        for outer in targets
        if inner.startswith(f"{outer}.") and inner in imports.get(outer, ())
    ]
    assert not circles, f"a package and a module inside it import each other: {circles}; move what both need below"
