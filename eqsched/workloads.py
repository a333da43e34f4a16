"""Named workloads: tensor computations with a size, registered so the CLI and benchmarks find them.

    @workload("matmul", params=("M", "N", "K"), default=(512, 512, 512), small=(16, 24, 8),
              numpy_fn=lambda ins, *size: {"C": ins["A"] @ ins["B"]})
    def matmul(M, N, K): ...  # returns a te.Computation

A workload's builder takes one positive int per parameter and returns a `Computation`.
Its numpy implementation, the baseline that benchmarks and the report compare against (the oracle
for correctness is `eqsched.reference`), is optional and comes in two forms:

- `numpy_fn(inputs, *size) -> outputs`: the simple form, a plain function.
- `numpy_prepare(inputs, *size) -> run`: allocates every buffer once and returns a zero-argument
  `run() -> outputs` that writes into them. A workload given only this form gets a `numpy_fn`
  that prepares and runs once.

Whoever times numpy calls `Workload.numpy_baseline(inputs, *size)` (the one shared path): it
returns the prepared `run`, or calls `numpy_fn` when that is all a workload has. The built-in
baselines are the strongest plain-numpy float32 formulation of each computation: one BLAS call
per matmul with `out=`, elementwise steps in place, conv2d as a contiguous im2col into a
preallocated buffer and one sgemm. A weaker baseline (fresh temporaries, transposed copies)
would inflate every "x numpy" figure.

See docs/ARCHITECTURE.md §15 Extending eqsched.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from numbers import Integral

import numpy as np

from .expr import all_of, exp, maximum, relu, select
from .te import Computation, WorkloadError, compute, max_, placeholder, reduce_axis, sum_

Builder = Callable[..., Computation]
NumpyFn = Callable[..., dict[str, np.ndarray]]  # (inputs, *size) -> {output name: array}
NumpyRun = Callable[[], dict[str, np.ndarray]]  # a prepared baseline: () -> its output buffers
NumpyPrepare = Callable[..., NumpyRun]  # (inputs, *size) -> NumpyRun


@dataclass(frozen=True)
class Workload:
    name: str
    params: tuple[str, ...]
    default_size: tuple[int, ...]
    small_size: tuple[int, ...]
    builder: Builder
    numpy_fn: NumpyFn | None = None
    may_be_zero: tuple[str, ...] = ()  # parameters allowed to be 0 (e.g. conv2d's pad)
    description: str = ""
    numpy_prepare: NumpyPrepare | None = None

    def __post_init__(self) -> None:
        if self.numpy_fn is None and self.numpy_prepare is not None:
            object.__setattr__(self, "numpy_fn", _run_once(self.numpy_prepare))

    def check_size(self, size: Sequence[object]) -> tuple[int, ...]:
        """The size as a tuple of ints; WorkloadError names the first bad value."""
        if isinstance(size, (str, bytes, Mapping)) or not isinstance(size, Sequence):
            raise WorkloadError(f"{self.name}: a size is a list of {len(self.params)} integers "
                                f"({','.join(self.params)}), got {size!r}")
        if len(size) != len(self.params):
            raise WorkloadError(
                f"{self.name} takes {len(self.params)} sizes ({','.join(self.params)}), "
                f"got {len(size)}"
            )
        out = []
        for param, value in zip(self.params, size):
            if not isinstance(value, Integral) or isinstance(value, bool):
                raise WorkloadError(f"{self.name}: {param} must be an integer, got {value!r}")
            least = 0 if param in self.may_be_zero else 1
            if value < least:
                kind = "non-negative" if least == 0 else "positive"
                raise WorkloadError(f"{self.name}: {param} must be {kind}, got {value}")
            out.append(int(value))
        return tuple(out)

    def build(self, *size: int) -> Computation:
        return self.builder(*self.check_size(size))

    def flops(self, size: Sequence[int]) -> int:
        return self.build(*size).flops

    def numpy_baseline(self, inputs: Mapping[str, np.ndarray], *size: int) -> NumpyRun:
        """numpy's implementation of this workload on `inputs` at `size`, ready to be timed: a
        zero-argument callable returning {output name: array}.

        Everything a call needs is allocated here, once, so that timing the callable times the
        computation, not allocating (and page-faulting) fresh outputs and temporaries on every
        call, which a compiled kernel handed its output buffers never pays. Each call reads
        `inputs` anew (refill them in place to run on other data) and writes into the same
        buffers: the arrays it returns are overwritten by the next call (copy them to keep
        them). Inputs are expected as C-contiguous float32 arrays (what
        `eqsched.reference.random_inputs` makes); others are converted once, here. A workload
        registered with only `numpy_fn` gets a callable that calls it. WorkloadError if the
        workload has no numpy implementation or the size is bad.
        """
        size = self.check_size(size)
        if self.numpy_prepare is not None:
            return self.numpy_prepare(inputs, *size)
        if self.numpy_fn is None:
            raise WorkloadError(f"{self.name} has no numpy implementation")
        numpy_fn = self.numpy_fn
        return lambda: numpy_fn(inputs, *size)


def _run_once(prepare: NumpyPrepare) -> NumpyFn:
    """The simple form of a prepared baseline: prepare, run once, return fresh outputs."""

    def numpy_fn(inputs: Mapping[str, np.ndarray], *size: int) -> dict[str, np.ndarray]:
        return prepare(inputs, *size)()

    numpy_fn.__doc__ = prepare.__doc__
    return numpy_fn


_REGISTRY: dict[str, Workload] = {}


def register(wl: Workload) -> Workload:
    wl.check_size(wl.default_size)
    wl.check_size(wl.small_size)
    if wl.name in _REGISTRY and _REGISTRY[wl.name].builder is not wl.builder:
        raise WorkloadError(f"a different workload named {wl.name!r} is already registered")
    _REGISTRY[wl.name] = wl
    return wl


def workload(
    name: str,
    params: Sequence[str],
    default: Sequence[int],
    small: Sequence[int],
    numpy_fn: NumpyFn | None = None,
    may_be_zero: Sequence[str] = (),
    numpy_prepare: NumpyPrepare | None = None,
) -> Callable[[Builder], Builder]:
    """Decorator registering a builder function as a workload; returns the function unchanged.
    `numpy_fn` / `numpy_prepare`: its numpy baseline in the simple or the prepared form (see
    the module docstring)."""

    def register_builder(fn: Builder) -> Builder:
        doc = (fn.__doc__ or "").strip().splitlines()
        register(Workload(name, tuple(params), tuple(default), tuple(small), fn, numpy_fn,
                          tuple(may_be_zero), doc[0] if doc else "", numpy_prepare))
        return fn

    return register_builder


def get_workload(name: str) -> Workload:
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY))
        raise WorkloadError(f"unknown workload {name!r} (known: {known})") from None


def list_workloads() -> list[Workload]:
    return [_REGISTRY[n] for n in sorted(_REGISTRY)]


# ---- built-in workloads ---------------------------------------------------------------------


def _f32(inputs: Mapping[str, np.ndarray], *names: str) -> list[np.ndarray]:
    """The named inputs as C-contiguous float32 arrays (the same arrays when they already are)."""
    return [np.ascontiguousarray(inputs[n], dtype=np.float32) for n in names]


def _matmul_numpy(ins: Mapping[str, np.ndarray], *size: int) -> NumpyRun:
    """C = A @ B (batched when A and B are stacks): one sgemm per matrix into a buffer."""
    a, b = _f32(ins, "A", "B")
    c = np.empty(a.shape[:-1] + b.shape[-1:], np.float32)

    def run() -> dict[str, np.ndarray]:
        np.matmul(a, b, out=c)
        return {"C": c}

    return run


@workload("matmul", params=("M", "N", "K"), default=(512, 512, 512), small=(16, 24, 8),
          numpy_prepare=_matmul_numpy)
def matmul(M: int, N: int, K: int) -> Computation:
    """C[M,N] = A[M,K] @ B[K,N]."""
    A = placeholder((M, K), "A")
    B = placeholder((K, N), "B")
    k = reduce_axis(K, "k")
    C = compute((M, N), lambda i, j: sum_(A[i, k] * B[k, j], axis=k), "C")
    return Computation("matmul", [C], flops=2 * M * N * K)


@workload("gemv", params=("N", "K"), default=(4096, 4096), small=(24, 40),
          numpy_prepare=_matmul_numpy)
def gemv(N: int, K: int) -> Computation:
    """C[1,N] = A[1,K] @ B[K,N]: a matrix-vector product, as a batch-1 linear layer. Its one
    row leaves the threads the columns to share, or the reduction once factored (rfactor)."""
    A = placeholder((1, K), "A")
    B = placeholder((K, N), "B")
    k = reduce_axis(K, "k")
    C = compute((1, N), lambda i, j: sum_(A[i, k] * B[k, j], axis=k), "C")
    return Computation("gemv", [C], flops=2 * N * K)


@workload("batch_matmul", params=("B", "M", "N", "K"), default=(16, 256, 256, 256),
          small=(3, 8, 12, 5), numpy_prepare=_matmul_numpy)
def batch_matmul(Bt: int, M: int, N: int, K: int) -> Computation:
    """C[B,M,N] = A[B,M,K] @ B[B,K,N], one matmul per batch entry."""
    A = placeholder((Bt, M, K), "A")
    B = placeholder((Bt, K, N), "B")
    k = reduce_axis(K, "k")
    C = compute((Bt, M, N), lambda b, i, j: sum_(A[b, i, k] * B[b, k, j], axis=k), "C")
    return Computation("batch_matmul", [C], flops=2 * Bt * M * N * K)


def _mm_exp_mm_numpy(ins: Mapping[str, np.ndarray], M: int, K: int, L: int, N: int
                     ) -> NumpyRun:
    """sgemm into D, exp of D in place, sgemm into F."""
    a, b, e = _f32(ins, "A", "B", "E")
    d = np.empty((M, L), np.float32)
    f = np.empty((M, N), np.float32)

    def run() -> dict[str, np.ndarray]:
        np.matmul(a, b, out=d)
        np.exp(d, out=d)
        np.matmul(d, e, out=f)
        return {"F": f}

    return run


@workload("mm_exp_mm", params=("M", "K", "L", "N"), default=(1024, 2048, 1024, 3072),
          small=(8, 6, 12, 10), numpy_prepare=_mm_exp_mm_numpy)
def mm_exp_mm(M: int, K: int, L: int, N: int) -> Computation:
    """F[M,N] = exp(A[M,K] @ B[K,L]) @ E[L,N]: a matmul chain through an elementwise stage."""
    A = placeholder((M, K), "A")
    B = placeholder((K, L), "B")
    E = placeholder((L, N), "E")
    k = reduce_axis(K, "k")
    C = compute((M, L), lambda i, j: sum_(A[i, k] * B[k, j], axis=k), "C")
    D = compute((M, L), lambda i, j: exp(C[i, j]), "D")
    m = reduce_axis(L, "l")
    F = compute((M, N), lambda i, j: sum_(D[i, m] * E[m, j], axis=m), "F")
    return Computation("mm_exp_mm", [F], flops=2 * M * K * L + M * L + 2 * M * L * N)


def conv2d_out_size(extent: int, window: int, stride: int, pad: int) -> int:
    return (extent + 2 * pad - window) // stride + 1


def _window_rows(taps: int, out: int, extent: int, stride: int, pad: int
                 ) -> list[tuple[int, int, int]]:
    """Per window tap t: the outputs o0 <= o < o1 whose input o*stride + t - pad lies inside
    [0, extent), and that first input index."""
    rows = []
    for t in range(taps):
        o0 = max(0, -((t - pad) // stride))  # ceil((pad - t) / stride)
        o1 = min(out, (extent - 1 + pad - t) // stride + 1)
        rows.append((o0, o1, o0 * stride + t - pad))
    return rows


def _conv2d_numpy(ins: Mapping[str, np.ndarray], N: int, C: int, H: int, W: int, K: int, R: int,
                  S: int, stride: int, pad: int) -> NumpyRun:
    """im2col + one sgemm, the way a BLAS-backed framework runs it.

    cols[n, (c, r, s), (p, q)] = X[n, c, p*stride + r - pad, q*stride + s - pad] is one
    contiguous buffer allocated here, holding zeros where a window reads padding (those entries
    never change). A call copies the R*S shifted views of X into it (rows of contiguous floats)
    and multiplies W[K, C*R*S] @ cols[n] into Y[n] seen as [K, P*Q]: NCHW out of the sgemm with
    no transpose (one sgemm per image; the default batch is 1).
    """
    P, Q = conv2d_out_size(H, R, stride, pad), conv2d_out_size(W, S, stride, pad)
    x, w = _f32(ins, "X", "W")
    cols = np.zeros((N, C, R, S, P, Q), np.float32)
    y = np.empty((N, K, P, Q), np.float32)
    copies = []
    for r, (p0, p1, h0) in enumerate(_window_rows(R, P, H, stride, pad)):
        for s, (q0, q1, w0) in enumerate(_window_rows(S, Q, W, stride, pad)):
            if p0 < p1 and q0 < q1:
                copies.append((cols[:, :, r, s, p0:p1, q0:q1],
                               x[:, :, h0:h0 + (p1 - p0 - 1) * stride + 1:stride,
                                 w0:w0 + (q1 - q0 - 1) * stride + 1:stride]))
    weights = w.reshape(K, C * R * S)
    cols_mat, y_mat = cols.reshape(N, C * R * S, P * Q), y.reshape(N, K, P * Q)

    def run() -> dict[str, np.ndarray]:
        for window, view in copies:
            np.copyto(window, view)
        np.matmul(weights, cols_mat, out=y_mat)
        return {"Y": y}

    return run


@workload("conv2d_nchw", params=("N", "C", "H", "W", "K", "R", "S", "stride", "pad"),
          default=(1, 64, 56, 56, 64, 3, 3, 1, 1), small=(1, 3, 7, 6, 4, 3, 3, 1, 1),
          numpy_prepare=_conv2d_numpy, may_be_zero=("pad",))
def conv2d_nchw(N: int, C: int, H: int, W: int, K: int, R: int, S: int, stride: int,
                pad: int) -> Computation:
    """Y[N,K,P,Q] = conv(X[N,C,H,W], W[K,C,R,S]) with zero padding (default: a ResNet layer)."""
    P, Q = conv2d_out_size(H, R, stride, pad), conv2d_out_size(W, S, stride, pad)
    if P < 1 or Q < 1:
        raise WorkloadError(f"conv2d_nchw: a {R}x{S} window does not fit a padded {H}x{W} input")
    X = placeholder((N, C, H, W), "X")
    Wt = placeholder((K, C, R, S), "W")
    src = X
    if pad:
        src = compute(
            (N, C, H + 2 * pad, W + 2 * pad),
            lambda n, c, h, w: select(all_of(h >= pad, h < H + pad, w >= pad, w < W + pad),
                                      X[n, c, h - pad, w - pad], 0.0),
            "Xpad",
        )
    rc, ry, rx = reduce_axis(C, "rc"), reduce_axis(R, "ry"), reduce_axis(S, "rx")

    def strided(axis):  # keeps `p + ry` readable when stride is 1
        return axis * stride if stride > 1 else axis

    Y = compute(
        (N, K, P, Q),
        lambda n, k, p, q: sum_(src[n, rc, strided(p) + ry, strided(q) + rx] * Wt[k, rc, ry, rx],
                                axis=(rc, ry, rx)),
        "Y",
    )
    return Computation("conv2d_nchw", [Y], flops=2 * N * K * P * Q * C * R * S)


def _softmax_numpy(ins: Mapping[str, np.ndarray], rows: int, cols: int) -> NumpyRun:
    """Row max, then subtract, exp, row sum and scale by the sum's reciprocal, all in one output
    buffer (a multiply by 1/sum instead of a divide per element: 10-15% faster here)."""
    (x,) = _f32(ins, "X")
    y = np.empty((rows, cols), np.float32)
    row = np.empty((rows, 1), np.float32)

    def run() -> dict[str, np.ndarray]:
        np.max(x, axis=1, keepdims=True, out=row)
        np.subtract(x, row, out=y)
        np.exp(y, out=y)
        np.sum(y, axis=1, keepdims=True, out=row)
        np.reciprocal(row, out=row)
        np.multiply(y, row, out=y)
        return {"Y": y}

    return run


@workload("softmax", params=("rows", "cols"), default=(1024, 1024), small=(5, 17),
          numpy_prepare=_softmax_numpy)
def softmax(rows: int, cols: int) -> Computation:
    """Y = softmax(X) along rows: row max, exp of the difference, row sum, divide."""
    X = placeholder((rows, cols), "X")
    c = reduce_axis(cols, "c")
    Mx = compute((rows,), lambda i: max_(X[i, c], axis=c), "M")
    E = compute((rows, cols), lambda i, j: exp(X[i, j] - Mx[i]), "E")
    c2 = reduce_axis(cols, "c")
    S = compute((rows,), lambda i: sum_(E[i, c2], axis=c2), "S")
    Y = compute((rows, cols), lambda i, j: E[i, j] / S[i], "Y")
    return Computation("softmax", [Y])


def _mlp_numpy(ins: Mapping[str, np.ndarray], batch: int, n_in: int, hidden: int, n_out: int
               ) -> NumpyRun:
    """sgemm into H, bias and ReLU in place, sgemm into Y, bias in place."""
    x, w1, b1, w2, b2 = _f32(ins, "X", "W1", "b1", "W2", "b2")
    h = np.empty((batch, hidden), np.float32)
    y = np.empty((batch, n_out), np.float32)
    zero = np.float32(0)

    def run() -> dict[str, np.ndarray]:
        np.matmul(x, w1, out=h)
        np.add(h, b1, out=h)
        np.maximum(h, zero, out=h)
        np.matmul(h, w2, out=y)
        np.add(y, b2, out=y)
        return {"Y": y}

    return run


@workload("mlp", params=("batch", "in", "hidden", "out"), default=(128, 784, 128, 10),
          small=(4, 12, 8, 5), numpy_prepare=_mlp_numpy)
def mlp(batch: int, n_in: int, hidden: int, n_out: int) -> Computation:
    """Y = relu(X @ W1 + b1) @ W2 + b2: a two-layer perceptron (MNIST-sized by default)."""
    X = placeholder((batch, n_in), "X")
    W1 = placeholder((n_in, hidden), "W1")
    b1 = placeholder((hidden,), "b1")
    W2 = placeholder((hidden, n_out), "W2")
    b2 = placeholder((n_out,), "b2")
    k = reduce_axis(n_in, "k")
    L1 = compute((batch, hidden), lambda b, h: sum_(X[b, k] * W1[k, h], axis=k), "L1")
    H = compute((batch, hidden), lambda b, h: relu(L1[b, h] + b1[h]), "H")
    m = reduce_axis(hidden, "m")
    L2 = compute((batch, n_out), lambda b, o: sum_(H[b, m] * W2[m, o], axis=m), "L2")
    Y = compute((batch, n_out), lambda b, o: L2[b, o] + b2[o], "Y")
    return Computation("mlp", [Y])


# Elements per block of the elementwise chain: 256 KB per array, so the block of Z stays in a
# core's L2 (1 MB here) through the chain's six passes.
_CHAIN_BLOCK = 1 << 16


def _elementwise_chain_numpy(ins: Mapping[str, np.ndarray], n: int) -> NumpyRun:
    """The chain in place in Z, block by block so each block stays in cache through the six
    passes (numexpr's trick in plain numpy): whole-array passes stream every temporary through
    memory six times."""
    x, y = _f32(ins, "X", "Y")
    z = np.empty(n, np.float32)
    blocks = [(x[i:i + _CHAIN_BLOCK], y[i:i + _CHAIN_BLOCK], z[i:i + _CHAIN_BLOCK])
              for i in range(0, n, _CHAIN_BLOCK)]
    half, zero = np.float32(0.5), np.float32(0)

    def run() -> dict[str, np.ndarray]:
        for xb, yb, zb in blocks:
            np.multiply(xb, yb, out=zb)
            np.add(zb, xb, out=zb)
            np.multiply(zb, half, out=zb)
            np.exp(zb, out=zb)
            np.subtract(zb, yb, out=zb)
            np.maximum(zb, zero, out=zb)
        return {"Z": z}

    return run


@workload("elementwise_chain", params=("n",), default=(1 << 22,), small=(37,),
          numpy_prepare=_elementwise_chain_numpy)
def elementwise_chain(n: int) -> Computation:
    """Z = max(exp((X*Y + X) * 0.5) - Y, 0) as three elementwise stages (a fusion exercise)."""
    X = placeholder((n,), "X")
    Y = placeholder((n,), "Y")
    T = compute((n,), lambda i: X[i] * Y[i] + X[i], "T")
    U = compute((n,), lambda i: exp(T[i] * 0.5), "U")
    Z = compute((n,), lambda i: maximum(U[i] - Y[i], 0.0), "Z")
    return Computation("elementwise_chain", [Z])


__all__ = [
    "NumpyFn", "NumpyPrepare", "NumpyRun", "Workload", "WorkloadError", "conv2d_out_size",
    "get_workload", "list_workloads", "register", "workload",
]
