"""Graphviz export of a space's DAG (`Space.to_json()`): one cluster per e-class, one box per
e-node, an edge from a node to each child class. Meant for small spaces, to look at by eye.

See docs/ARCHITECTURE.md §4 The e-graph.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


def _label(node: dict) -> str:
    text = " ".join([node["op"], *(str(x) if x != "" else '""' for x in node["literals"])])
    return text.replace("\\", "\\\\").replace('"', '\\"')


def dag_to_dot(dag: dict) -> str:
    lines = ["digraph space {", "  compound=true; node [shape=box, fontsize=10];"]
    for name, cls in dag["classes"].items():
        lines.append(f'  subgraph cluster_{name} {{ label="{name}: {cls["structures"]}";')
        for i, node in enumerate(cls["nodes"]):
            lines.append(f'    {name}_{i} [label="{_label(node)}"];')
        lines.append("  }")
    for name, cls in dag["classes"].items():
        for i, node in enumerate(cls["nodes"]):
            for child in node["children"]:
                # An edge to a class points at its cluster (graphviz needs a node: its first one).
                lines.append(f"  {name}_{i} -> {child}_0 [lhead=cluster_{child}];")
    lines.append("}")
    return "\n".join(lines) + "\n"


def write_dot(text: str, path: str | Path) -> tuple[Path, Path | None]:
    """Write `path` with suffix .dot and, when graphviz's `dot` is installed, the .svg next to it.
    Returns (dot file, svg file or None)."""
    dot_path = Path(path).with_suffix(".dot")
    dot_path.write_text(text)
    binary = shutil.which("dot")
    if binary is None:
        return dot_path, None
    svg_path = dot_path.with_suffix(".svg")
    subprocess.run([binary, "-Tsvg", str(dot_path), "-o", str(svg_path)], check=True,
                   capture_output=True, timeout=120)
    return dot_path, svg_path
