"""Named workloads: tensor computations with a size, registered so the CLI and benchmarks find them.

    @workload("matmul", params=("M", "N", "K"), default=(512, 512, 512), small=(16, 24, 8),
              numpy_fn=lambda ins, *size: {"C": ins["A"] @ ins["B"]})
    def matmul(M, N, K): ...  # returns a te.Computation

A workload's builder takes one positive int per parameter and returns a `Computation`.
`numpy_fn(inputs, *size) -> outputs` is an optional fast float32 numpy implementation, the
baseline that benchmarks compare against (the oracle for correctness is `eqsched.reference`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from numbers import Integral

import numpy as np

from .expr import all_of, exp, maximum, relu, select
from .te import Computation, WorkloadError, compute, max_, placeholder, reduce_axis, sum_

Builder = Callable[..., Computation]
NumpyFn = Callable[..., dict[str, np.ndarray]]


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

    def check_size(self, size: Sequence[object]) -> tuple[int, ...]:
        """The size as a tuple of ints; WorkloadError names the first bad value."""
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
) -> Callable[[Builder], Builder]:
    """Decorator registering a builder function as a workload; returns the function unchanged."""

    def register_builder(fn: Builder) -> Builder:
        doc = (fn.__doc__ or "").strip().splitlines()
        register(Workload(name, tuple(params), tuple(default), tuple(small), fn, numpy_fn,
                          tuple(may_be_zero), doc[0] if doc else ""))
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


@workload("matmul", params=("M", "N", "K"), default=(512, 512, 512), small=(16, 24, 8),
          numpy_fn=lambda ins, *size: {"C": ins["A"] @ ins["B"]})
def matmul(M: int, N: int, K: int) -> Computation:
    """C[M,N] = A[M,K] @ B[K,N]."""
    A = placeholder((M, K), "A")
    B = placeholder((K, N), "B")
    k = reduce_axis(K, "k")
    C = compute((M, N), lambda i, j: sum_(A[i, k] * B[k, j], axis=k), "C")
    return Computation("matmul", [C], flops=2 * M * N * K)


@workload("batch_matmul", params=("B", "M", "N", "K"), default=(16, 256, 256, 256),
          small=(3, 8, 12, 5), numpy_fn=lambda ins, *size: {"C": ins["A"] @ ins["B"]})
def batch_matmul(Bt: int, M: int, N: int, K: int) -> Computation:
    """C[B,M,N] = A[B,M,K] @ B[B,K,N], one matmul per batch entry."""
    A = placeholder((Bt, M, K), "A")
    B = placeholder((Bt, K, N), "B")
    k = reduce_axis(K, "k")
    C = compute((Bt, M, N), lambda b, i, j: sum_(A[b, i, k] * B[b, k, j], axis=k), "C")
    return Computation("batch_matmul", [C], flops=2 * Bt * M * N * K)


def _mm_exp_mm_numpy(ins: dict[str, np.ndarray], *size: int) -> dict[str, np.ndarray]:
    return {"F": np.exp(ins["A"] @ ins["B"]) @ ins["E"]}


@workload("mm_exp_mm", params=("M", "K", "L", "N"), default=(1024, 2048, 1024, 3072),
          small=(8, 6, 12, 10), numpy_fn=_mm_exp_mm_numpy)
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


def _conv2d_numpy(ins: dict[str, np.ndarray], N: int, C: int, H: int, W: int, K: int, R: int,
                  S: int, stride: int, pad: int) -> dict[str, np.ndarray]:
    """im2col + one sgemm, the way a BLAS-backed framework runs it."""
    x = np.pad(ins["X"], ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    windows = np.lib.stride_tricks.sliding_window_view(x, (R, S), axis=(2, 3))
    windows = windows[:, :, ::stride, ::stride]  # N, C, P, Q, R, S
    P, Q = windows.shape[2], windows.shape[3]
    cols = windows.transpose(0, 2, 3, 1, 4, 5).reshape(N * P * Q, C * R * S)
    out = cols @ ins["W"].reshape(K, C * R * S).T
    return {"Y": np.ascontiguousarray(out.reshape(N, P, Q, K).transpose(0, 3, 1, 2))}


@workload("conv2d_nchw", params=("N", "C", "H", "W", "K", "R", "S", "stride", "pad"),
          default=(1, 64, 56, 56, 64, 3, 3, 1, 1), small=(1, 3, 7, 6, 4, 3, 3, 1, 1),
          numpy_fn=_conv2d_numpy, may_be_zero=("pad",))
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


def _softmax_numpy(ins: dict[str, np.ndarray], *size: int) -> dict[str, np.ndarray]:
    x = ins["X"]
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return {"Y": e / e.sum(axis=1, keepdims=True)}


@workload("softmax", params=("rows", "cols"), default=(1024, 1024), small=(5, 17),
          numpy_fn=_softmax_numpy)
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


def _mlp_numpy(ins: dict[str, np.ndarray], *size: int) -> dict[str, np.ndarray]:
    hidden = np.maximum(ins["X"] @ ins["W1"] + ins["b1"], 0)
    return {"Y": hidden @ ins["W2"] + ins["b2"]}


@workload("mlp", params=("batch", "in", "hidden", "out"), default=(128, 784, 128, 10),
          small=(4, 12, 8, 5), numpy_fn=_mlp_numpy)
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


def _elementwise_chain_numpy(ins: dict[str, np.ndarray], *size: int) -> dict[str, np.ndarray]:
    x, y = ins["X"], ins["Y"]
    return {"Z": np.maximum(np.exp((x * y + x) * np.float32(0.5)) - y, 0)}


@workload("elementwise_chain", params=("n",), default=(1 << 22,), small=(37,),
          numpy_fn=_elementwise_chain_numpy)
def elementwise_chain(n: int) -> Computation:
    """Z = max(exp((X*Y + X) * 0.5) - Y, 0) as three elementwise stages (a fusion exercise)."""
    X = placeholder((n,), "X")
    Y = placeholder((n,), "Y")
    T = compute((n,), lambda i: X[i] * Y[i] + X[i], "T")
    U = compute((n,), lambda i: exp(T[i] * 0.5), "U")
    Z = compute((n,), lambda i: maximum(U[i] - Y[i], 0.0), "Z")
    return Computation("elementwise_chain", [Z])


__all__ = [
    "Workload", "WorkloadError", "conv2d_out_size", "get_workload", "list_workloads", "register",
    "workload",
]
