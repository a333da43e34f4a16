"""exp, log, tanh and erf as straight-line float32 code, scalar or `<L x float>`; broadcasting.

LLVM's `llvm.exp`/`llvm.log` intrinsics become one libm call per lane, so a vectorized loop with an
exp in it would run at scalar speed. These are the Cephes/SLEEF algorithms: range reduction, a
short polynomial, and selects (never branches) for the special cases, so every lane takes the
same path.

See docs/ARCHITECTURE.md §7 Backend and target.
"""

from __future__ import annotations

import math

from llvmlite import ir

F32 = ir.FloatType()
I32 = ir.IntType(32)


def declare(module: ir.Module, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
    """The declaration of function `name` (an LLVM intrinsic) in `module`, made on first use."""
    if name in module.globals:
        return module.globals[name]
    return ir.Function(module, ir.FunctionType(ret, args), name)


def intrinsic(module: ir.Module, name: str, ty: ir.Type, nargs: int) -> ir.Function:
    """Declare (once) the overload of `llvm.<name>` for float or `<L x float>` arguments."""
    suffix = f"v{ty.count}f32" if isinstance(ty, ir.VectorType) else "f32"
    return declare(module, f"llvm.{name}.{suffix}", ty, [ty] * nargs)


class MathEmitter:
    """Emits float code of one shape (`ty` is float or `<L x float>`) at the builder's position."""

    def __init__(self, builder: ir.IRBuilder, ty: ir.Type):
        self.b = builder
        self.ty = ty
        lanes = ty.count if isinstance(ty, ir.VectorType) else None
        self.ity = ir.VectorType(I32, lanes) if lanes else I32

    def f(self, value: float) -> ir.Constant:
        return _splat(self.ty, value)

    def i(self, value: int) -> ir.Constant:
        return _splat(self.ity, value)

    def call(self, name: str, *args: ir.Value) -> ir.Value:
        return self.b.call(intrinsic(self.b.module, name, self.ty, len(args)), args)

    def extremum(self, name: str, a: ir.Value, b: ir.Value) -> ir.Value:
        """llvm.maximum / llvm.minimum: NaN propagates, as in numpy. `nsz` lets either zero
        answer a tie of -0.0 and +0.0 (they compare equal, as the checks against numpy do);
        without it x86 tests the sign of an operand through an integer register at every call,
        which lengthens each step of a max reduction's dependent chain."""
        return self.b.call(intrinsic(self.b.module, name, self.ty, 2), (a, b), fastmath=("nsz",))

    def fma(self, a: ir.Value, b: ir.Value, c: ir.Value) -> ir.Value:
        return self.call("fma", a, b, c)

    def poly(self, x: ir.Value, coeffs: list[float]) -> ir.Value:
        """Horner's rule, highest coefficient first."""
        acc = self.f(coeffs[0])
        for c in coeffs[1:]:
            acc = self.fma(acc, x, self.f(c))
        return acc

    def pick(self, cond: ir.Value, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.b.select(cond, a, b)

    def pow2(self, n: ir.Value) -> ir.Value:
        """2**n for integer n in [-126, 127], built in the exponent field."""
        return self.b.bitcast(self.b.shl(self.b.add(n, self.i(127)), self.i(23)), self.ty)

    # ---- the functions -------------------------------------------------------------------------

    def exp(self, x: ir.Value) -> ir.Value:
        b = self.b
        # Clamp first so the integer conversion below never sees NaN or huge values (fptosi of
        # those is poison); the special results are selected at the end.
        xc = self.pick(b.fcmp_ordered(">", x, self.f(-104.0)), x, self.f(-104.0))
        xc = self.pick(b.fcmp_ordered("<", xc, self.f(89.0)), xc, self.f(89.0))
        q = self.call("roundeven", b.fmul(xc, self.f(1.442695040888963407359924681001892137)))
        s = self.fma(q, self.f(-0.693145751953125), xc)
        s = self.fma(q, self.f(-1.428606765330187045e-06), s)
        u = self.poly(s, [
            0.000198527617612853646278381, 0.00139304355252534151077271,
            0.00833336077630519866943359, 0.0416664853692054748535156,
            0.166666671633720397949219, 0.5,
        ])
        u = b.fadd(self.f(1.0), self.fma(b.fmul(s, s), u, s))
        # 2**q in two factors, so results down in the subnormal range (q < -126) come out right.
        n = b.fptosi(q, self.ity)
        half = b.ashr(n, self.i(1))
        u = b.fmul(b.fmul(u, self.pow2(half)), self.pow2(b.sub(n, half)))
        u = self.pick(b.fcmp_ordered(">", x, self.f(88.72283935546875)), self.f(math.inf), u)
        u = self.pick(b.fcmp_ordered("<", x, self.f(-104.0)), self.f(0.0), u)
        return self.pick(b.fcmp_unordered("uno", x, x), x, u)

    def log(self, x: ir.Value) -> ir.Value:
        b = self.b
        # Subnormals: scale into the normal range first, then take 23 off the exponent.
        tiny = b.fcmp_ordered("<", x, self.f(1.17549435e-38))
        xs = self.pick(tiny, b.fmul(x, self.f(8388608.0)), x)
        bits = b.bitcast(xs, self.ity)
        e = b.sub(b.lshr(bits, self.i(23)), self.i(126))
        e = b.sub(e, self.pick(tiny, self.i(23), self.i(0)))
        m = b.bitcast(b.or_(b.and_(bits, self.i(0x007FFFFF)), self.i(0x3F000000)), self.ty)
        # m in [0.5, 1); fold to [sqrt(1/2), sqrt(2)) - 1 so the polynomial's argument is small.
        low = b.fcmp_ordered("<", m, self.f(0.707106781186547524))
        e = b.sub(e, self.pick(low, self.i(1), self.i(0)))
        m = b.fsub(self.pick(low, b.fadd(m, m), m), self.f(1.0))
        ef = b.sitofp(e, self.ty)
        z = b.fmul(m, m)
        y = self.poly(m, [
            7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1,
            1.4249322787e-1, -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1,
            3.3333331174e-1,
        ])
        y = b.fmul(b.fmul(y, m), z)
        y = self.fma(ef, self.f(-2.12194440e-4), y)
        y = self.fma(z, self.f(-0.5), y)
        r = self.fma(ef, self.f(0.693359375), b.fadd(m, y))
        r = self.pick(b.fcmp_ordered("==", x, self.f(math.inf)), x, r)
        r = self.pick(b.fcmp_ordered("==", x, self.f(0.0)), self.f(-math.inf), r)
        # x < 0 and NaN both give NaN ("ult" is true for either).
        return self.pick(b.fcmp_unordered("<", x, self.f(0.0)), self.f(math.nan), r)

    def tanh(self, x: ir.Value) -> ir.Value:
        b = self.b
        ax = self.call("fabs", x)
        # Small |x|: odd polynomial (1 - 2/(e^2x + 1) would cancel catastrophically there).
        z = b.fmul(x, x)
        small = self.poly(z, [
            -5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1,
            -3.33332819422e-1,
        ])
        small = self.fma(b.fmul(small, z), x, x)
        e2 = self.exp(b.fadd(ax, ax))
        big = b.fsub(self.f(1.0), b.fdiv(self.f(2.0), b.fadd(e2, self.f(1.0))))
        big = self.call("copysign", big, x)
        r = self.pick(b.fcmp_ordered("<", ax, self.f(0.625)), small, big)
        return self.pick(b.fcmp_unordered("uno", x, x), x, r)

    def erf(self, x: ir.Value) -> ir.Value:
        b = self.b
        # erf is +-1 in float32 beyond |x| = 4; clamping there keeps the rational function (odd
        # numerator over even denominator, the approximation Eigen's and XLA's float erf use) on
        # the interval it was fitted to. NaN, which the clamps drop, is put back last.
        xc = self.call("maxnum", self.call("minnum", x, self.f(4.0)), self.f(-4.0))
        z = b.fmul(xc, xc)
        p = self.poly(z, [
            -2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06,
            -5.69250639462346e-05, -7.34990630326855e-04, -2.95459980854025e-03,
            -1.60960333262415e-02,
        ])
        q = self.poly(z, [
            -1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
            -7.37332916720468e-03, -1.42647390514189e-02,
        ])
        r = b.fdiv(b.fmul(p, xc), q)
        return self.pick(b.fcmp_unordered("uno", x, x), x, r)


def broadcast(builder: ir.IRBuilder, value: ir.Value, ty: ir.VectorType) -> ir.Value:
    """`value` in every lane of a vector of type `ty`."""
    if isinstance(value, ir.Constant):
        return ir.Constant(ty, [value.constant] * ty.count)
    one = builder.insert_element(ir.Constant(ty, ir.Undefined), value, ir.Constant(I32, 0))
    zeros = ir.Constant(ir.VectorType(I32, ty.count), [0] * ty.count)
    return builder.shuffle_vector(one, ir.Constant(ty, ir.Undefined), zeros)


def same_shape(builder: ir.IRBuilder, x: ir.Value, y: ir.Value) -> tuple[ir.Value, ir.Value]:
    """Broadcast whichever of x, y is a scalar when the other is a vector."""
    if isinstance(x.type, ir.VectorType) and not isinstance(y.type, ir.VectorType):
        return x, broadcast(builder, y, x.type)
    if isinstance(y.type, ir.VectorType) and not isinstance(x.type, ir.VectorType):
        return broadcast(builder, x, y.type), y
    return x, y


def _splat(ty: ir.Type, value: float) -> ir.Constant:
    if isinstance(ty, ir.VectorType):
        return ir.Constant(ty, [value] * ty.count)
    return ir.Constant(ty, value)
