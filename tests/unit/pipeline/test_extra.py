"""``pip install 'kcoord[pipeline]'`` brings every package the pipeline imports: a Spark worker
gets kcoord with that extra only, and confluent-kafka, which the source and the sink use, was
in the ``test`` extra alone (``make`` installs both, which hid it)."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def _requirement_names(requirements: list[str]) -> set[str]:
    return {
        re.split(r"[<>=!~\[;\s]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements
    }


def test_the_pipeline_extra_holds_what_the_pipeline_imports() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    allowed = _requirement_names(project["dependencies"]) | _requirement_names(
        project["optional-dependencies"]["pipeline"]
    )
    imported: set[str] = set()
    for path in (REPO / "src" / "kcoord" / "pipeline").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    third_party = imported - set(sys.stdlib_module_names) - {"kcoord", "__future__"}
    providers = packages_distributions()
    missing = {
        module: providers.get(module)
        for module in third_party
        if not {d.lower().replace("_", "-") for d in providers.get(module, [])} & allowed
    }
    assert not missing, f"imported by the pipeline, in neither its extra nor the core: {missing}"
