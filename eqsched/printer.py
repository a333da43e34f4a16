"""A stable, readable text form of a program (TVMScript-like); also the input of `Program.hash`.

    program matmul
      input  A: float32[64, 64]
      ...
    for C.i in range(64):
      for C.j in vectorized(16):
        C.update(i = C.i, j = C.j, k = C.k):
          C[i, j] += A[i, k] * B[k, j]
"""

from __future__ import annotations

from .expr import to_str
from .ir import Alloc, Binding, Block, Loop, LoopKind, Node, Program

_KIND = {
    LoopKind.SERIAL: "range",
    LoopKind.PARALLEL: "parallel",
    LoopKind.VECTORIZED: "vectorized",
    LoopKind.UNROLLED: "unrolled",
}
_ACC = {"sum": "+=", "max": "max="}


def _binding(b: Binding) -> str:
    parts = [lp if s == 1 else f"{s}*{lp}" for lp, s in b.terms]
    if b.offset or not parts:
        parts.append(str(b.offset))
    return f"{b.axis} = {' + '.join(parts)}"


def _block(b: Block, pad: str) -> list[str]:
    head = f"{pad}{b.name}({', '.join(_binding(x) for x in b.bindings)}):"
    target = f"{b.buffer}[{', '.join(to_str(i) for i in b.indices)}]"
    op = _ACC[b.reduce] if b.reduce else "="
    return [head, f"{pad}  {target} {op} {to_str(b.value)}"]


def _nodes(nodes: tuple[Node, ...], depth: int, out: list[str], prog: Program) -> None:
    pad = "  " * depth
    for n in nodes:
        if isinstance(n, Loop):
            out.append(f"{pad}for {n.name} in {_KIND[n.kind]}({n.extent}):")
            _nodes(n.body, depth + 1, out, prog)
        elif isinstance(n, Alloc):
            buf = prog.buffer(n.buffer)
            out.append(f"{pad}alloc {n.buffer}: {buf.dtype}{list(buf.shape)}:")
            _nodes(n.body, depth + 1, out, prog)
        else:
            out.extend(_block(n, pad))


def print_program(prog: Program) -> str:
    lines = [f"program {prog.name}"]
    for b in prog.buffers:
        if b.scope.value != "local":
            lines.append(f"  {b.scope.value:<6} {b.name}: {b.dtype}{list(b.shape)}")
    _nodes(prog.body, 0, lines, prog)
    return "\n".join(lines) + "\n"
