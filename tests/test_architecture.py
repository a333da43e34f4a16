"""The rules of docs/ARCHITECTURE.md that the source itself can be checked against: every module's
docstring ends with a pointer to an existing section, every section a comment cites exists, no
module below the command line imports it or the tools (§14 Layering), and no import cycles.

The checks read the files of the repository checkout (eqsched/, rules/ as eqsched.rules, extract/
as eqsched.extract), not the installed package, and parse imports with `ast`, including those
inside functions. Without docs/ (an installed-only run) they are skipped.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "ARCHITECTURE.md"

if not DOC.is_file() or not (ROOT / "rules").is_dir() or not (ROOT / "extract").is_dir():
    pytest.skip("needs the repository checkout (docs/ARCHITECTURE.md, rules/, extract/)",
                allow_module_level=True)

# Where each package's files are: rules/ and extract/ install as eqsched.rules / eqsched.extract.
PACKAGES = {"eqsched": ROOT / "eqsched", "eqsched.rules": ROOT / "rules",
            "eqsched.extract": ROOT / "extract"}
# The command line and the tools sit on top: only they may import eqsched.cli or eqsched.tools.
TOP = ("eqsched.cli", "eqsched.tools")
POINTER = re.compile(r"See docs/ARCHITECTURE\.md (§.+)\.")
CITATION = re.compile(r"ARCHITECTURE\.md[\s#]*§(\d+(?:\.\d+)?)")


def _sections() -> dict[str, str]:
    """Section number -> title, from the document's `## N. Title` and `### N.M Title` headings."""
    text = DOC.read_text(encoding="utf-8")
    return dict(re.findall(r"^#{2,3} (\d+(?:\.\d+)?)\.? +(.+?) *$", text, re.M))


def _modules() -> dict[str, Path]:
    """Module name -> file, for every module of the three packages, at any depth. A folder that is
    a symlink (eqsched/rules -> ../rules) is not walked: its package has its own entry."""
    out: dict[str, Path] = {}
    for package, folder in PACKAGES.items():
        for dirpath, dirnames, filenames in os.walk(folder):  # does not follow symlinks
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            rel = Path(dirpath).relative_to(folder).parts
            for name in sorted(filenames):
                if not name.endswith(".py"):
                    continue
                parts = [package, *rel] + ([] if name == "__init__.py" else [name[:-3]])
                out[".".join(parts)] = Path(dirpath) / name
    return out


MODULES = _modules()
SECTIONS = _sections()


def _is_package(module: str) -> bool:
    return MODULES[module].name == "__init__.py"


def _is_top(module: str) -> bool:
    return any(module == top or module.startswith(top + ".") for top in TOP)


def _imports(module: str) -> set[str]:
    """The modules of the three packages that `module` imports anywhere in its file (top level,
    functions, `if TYPE_CHECKING:`), resolved to the deepest known module of each name."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    package = module if _is_package(module) else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - (node.level - 1)])
                full = f"{base}.{node.module}" if node.module else base
            else:
                full = node.module or ""
            for alias in node.names:  # `from . import cli` imports the module eqsched.cli
                names.add(f"{full}.{alias.name}" if f"{full}.{alias.name}" in MODULES else full)
    out = set()
    for name in names:
        parts = name.split(".")
        known = next((".".join(parts[:i]) for i in range(len(parts), 0, -1)
                      if ".".join(parts[:i]) in MODULES), None)
        if _is_top(name) and not (known and _is_top(known)):
            out.add(name)  # eqsched.tools.x where no such file exists: still an import of tools
        elif known:
            out.add(known)
    out.discard(module)
    return out


def test_the_checkout_is_found():
    expected = {"eqsched", "eqsched.ir", "eqsched.rules", "eqsched.rules.tile", "eqsched.extract",
                "eqsched.extract.search", "eqsched.egraph.space", "eqsched.backend.lower"}
    assert expected <= set(MODULES)
    assert SECTIONS["4"] == "The e-graph" and SECTIONS["17.1"] == "The machine and the bars"


def test_every_module_docstring_ends_with_its_section():
    """The last line of each module docstring is `See docs/ARCHITECTURE.md §N Title.`, or several
    sections joined by `and`, each a heading of the document, number and title as written there."""
    bad = []
    for module, path in sorted(MODULES.items()):
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
        if not doc:
            bad.append(f"{module}: no docstring")
            continue
        match = POINTER.fullmatch(doc.strip().splitlines()[-1].strip())
        if not match:
            bad.append(f"{module}: the docstring's last line is not 'See docs/ARCHITECTURE.md §N "
                       f"Title.'")
            continue
        for part in re.split(r" and (?=§)", match.group(1)):
            number, _, title = part[1:].partition(" ")
            if SECTIONS.get(number) != title:
                bad.append(f"{module}: {part!r} is not a heading of docs/ARCHITECTURE.md")
    assert not bad, "\n".join(bad)


def test_cited_sections_exist():
    """Every `ARCHITECTURE.md §N` in the code, the tests and the examples names a section."""
    files = [*MODULES.values(), *(f for d in ("tests", "examples", "bench") if (ROOT / d).is_dir()
                                  for f in sorted((ROOT / d).rglob("*.py")))]
    bad = [f"{path.relative_to(ROOT)}: §{number}" for path in files
           for number in CITATION.findall(path.read_text(encoding="utf-8"))
           if number not in SECTIONS]
    assert not bad, "sections that docs/ARCHITECTURE.md does not have:\n" + "\n".join(bad)


def test_only_the_command_line_and_the_tools_import_them():
    """§14: nothing below `cli` imports it or `tools`; `__main__` runs the command."""
    bad = [f"{module} imports {target}" for module in sorted(MODULES)
           if not _is_top(module) and module != "eqsched.__main__"
           for target in sorted(_imports(module)) if _is_top(target)]
    assert not bad, "\n".join(bad)


def test_no_import_cycles():
    """§14: the import graph of eqsched, eqsched.rules and eqsched.extract (every import in a file,
    including those inside functions) has no cycle."""
    graph = nx.DiGraph()
    graph.add_nodes_from(MODULES)
    graph.add_edges_from((module, target) for module in MODULES for target in _imports(module)
                         if target in MODULES)
    cycles = sorted(" -> ".join([*c, c[0]]) for c in nx.simple_cycles(graph))
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_import_graph_sees_what_it_must():
    """The resolution the two checks rely on: relative imports at any depth, `from . import
    module`, imports inside functions, rules/ and extract/ under their installed names."""
    assert "eqsched.cli" in _imports("eqsched.__main__")
    assert "eqsched.egraph.facts" in _imports("eqsched.rules.tile")
    assert "eqsched.rules.analysis" in _imports("eqsched.rules.tile")
    assert "eqsched.extract.cost" in _imports("eqsched.extract.search")
    assert "eqsched.ir" in _imports("eqsched.egraph.term") | _imports("eqsched.egraph.encode")
    assert "eqsched.egraph.saturate" in _imports("eqsched.explore")
