"""Vectorizable float32 approximations of exp, tanh and erf, and powers by constants.

MLIR lowers `math.exp/tanh/erf` on f32 to calls of libm's expf/tanhf/erff, one element at a
time; LLVM cannot vectorize a loop around such a call, so every activation and softmax
ran scalar. These rewrites replace each op by plain arithmetic (polynomials, a floor, a
bit-cast) that LLVM's loop vectorizer turns into AVX code. The MLIR pass that does this
(math-polynomial-approximation) is not registered in the torch-mlir wheel, hence our own.
`math.powf` by a constant small integer or half (GELU's tanh form cubes its input) became
libm's powf per element too; it becomes products, sqrt and a division.

Accuracy, measured over [-110, 100] against float64
(tests/codegen/loops/test_approximations.py): exp < 1 ulp relative in the normal range (and
exact at 0, +-inf, NaN; 0 below -87.3, where results are under 1.22e-38, near or below FLT_MIN;
inf above 88.72); tanh and erf < 4e-7 absolute and relative. The forms are the classic ones:
Cody-Waite range reduction with a degree-5 polynomial for exp, and odd/even rational minimax
approximations on a clamped range for tanh and erf (coefficients as in Eigen's float kernels).
"""
from typing import Optional, Tuple

from torch_mlir import ir
from torch_mlir.dialects import arith, llvm, math

from blade.codegen.ir_queries import all_parallel, producer

# exp: x = n*ln2 + r, |r| <= ln2/2; exp(r) = 1 + r + r^2 * P(r)
_EXP_P = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
          1.6666665459e-1, 5.0000001201e-1)
_LN2_HI, _LN2_LO = 0.693359375, -2.12194440e-4
_LOG2E = 1.44269504088896341
# Below -87.3 the result flushes to 0: e**-87.3 = 1.22e-38 is just above FLT_MIN, so every
# result and intermediate is a normal float. Computing subnormals costs a microcode assist
# of 100+ cycles per element on x86 (softmax rows with -1e4 masks ran several times slower
# than eager), and with the bound at ln(FLT_MIN) itself, inputs clamped to it still gave
# products just under FLT_MIN.
_EXP_MAX, _EXP_MIN = 88.72283905206835, -87.3

# tanh(x) = x * P(x^2) / Q(x^2) on [-7.905, 7.905]; x itself below 4e-4
_TANH_P = (-2.76076847742355e-16, 2.00018790482477e-13, -8.60467152213735e-11,
           5.12229709037114e-08, 1.48572235717979e-05, 6.37261928875436e-04,
           4.89352455891786e-03)
_TANH_Q = (1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03,
           4.89352518554385e-03)
_TANH_CLAMP, _TANH_TINY = 7.90531110763549805, 0.0004

# erf(x) = x * P(x^2) / Q(x^2) on [-4, 4] (erf is +-1 in float32 beyond)
_ERF_P = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06,
          -5.69250639462346e-05, -7.34990630326855e-04, -2.95459980854025e-03,
          -1.60960333262415e-02)
_ERF_Q = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
          -7.37332916720468e-03, -1.42647390514189e-02)


class _Builder:
    """Scalar f32 arithmetic at the current insertion point."""

    def __init__(self, scalef: bool):
        self.scalef = scalef
        self.f32 = ir.F32Type.get()
        self.i32 = ir.IntegerType.get_signless(32)

    def const(self, value: float):
        return arith.ConstantOp(self.f32, ir.FloatAttr.get(self.f32, value)).result

    def int_const(self, value: int):
        return arith.ConstantOp(self.i32, ir.IntegerAttr.get(self.i32, value)).result

    def add(self, a, b):
        return arith.AddFOp(a, b).result

    def sub(self, a, b):
        return arith.SubFOp(a, b).result

    def mul(self, a, b):
        return arith.MulFOp(a, b).result

    def div(self, a, b):
        """a / b for a denominator that is finite and far from 0 by construction (a
        rational approximation's Q on its clamped range): `ninf` with `arcp` lets LLVM
        use the reciprocal estimate (see allow_reciprocal)."""
        return arith.DivFOp(a, b, fastmath=fastmath_attribute(
            arith.FastMathFlags.arcp | arith.FastMathFlags.ninf)).result

    def clamp(self, x, low: float, high: float):
        # maximumf/minimumf propagate NaN, so NaN stays NaN.
        return arith.MinimumFOp(arith.MaximumFOp(x, self.const(low)).result,
                                self.const(high)).result

    def poly(self, x, coefficients):
        """Horner's rule, highest degree first."""
        result = self.const(coefficients[0])
        for c in coefficients[1:]:
            result = self.add(self.mul(result, x), self.const(c))
        return result

    def select_if(self, predicate, a, bound: float, then_value, else_value):
        cond = arith.CmpFOp(predicate, a, self.const(bound)).result
        return arith.SelectOp(cond, then_value, else_value).result

    def pow2(self, n_int):
        """2**n for an i32 n in [-126, 127], built in the exponent bits."""
        biased = arith.AddIOp(n_int, self.int_const(127)).result
        bits = arith.ShLIOp(biased, self.int_const(23)).result
        return arith.BitcastOp(self.f32, bits).result


def _exp(b: _Builder, x):
    xc = b.clamp(x, _EXP_MIN, _EXP_MAX)
    n = math.FloorOp(b.add(b.mul(xc, b.const(_LOG2E)), b.const(0.5))).result
    r = b.sub(b.sub(xc, b.mul(n, b.const(_LN2_HI))), b.mul(n, b.const(_LN2_LO)))
    y = b.add(b.add(b.mul(b.mul(b.poly(r, _EXP_P), r), r), r), b.const(1.0))
    # y * 2**n for n in [-126, 128] (at 128 the product is still finite when y < 2**0.5).
    ni = arith.FPToSIOp(b.i32, n).result
    if b.scalef:  # ldexp: one vscalefps per 16 lanes
        result = llvm.intr_ldexp(b.f32, y, ni)
    else:  # two factors built in the exponent bits, each within normal exponents
        half = arith.ShRSIOp(ni, b.int_const(1)).result
        rest = arith.SubIOp(ni, half).result
        result = b.mul(b.mul(y, b.pow2(half)), b.pow2(rest))
    result = b.select_if(arith.CmpFPredicate.OGT, x, _EXP_MAX, b.const(float("inf")), result)
    return b.select_if(arith.CmpFPredicate.OLT, x, _EXP_MIN, b.const(0.0), result)


def _odd_rational(b: _Builder, x, bound: float, p, q):
    xc = b.clamp(x, -bound, bound)
    x2 = b.mul(xc, xc)
    return b.div(b.mul(xc, b.poly(x2, p)), b.poly(x2, q))


def _tanh(b: _Builder, x):
    result = _odd_rational(b, x, _TANH_CLAMP, _TANH_P, _TANH_Q)
    small = b.select_if(arith.CmpFPredicate.OLT, math.AbsFOp(x).result, _TANH_TINY, x, result)
    return small


def _erf(b: _Builder, x):
    return _odd_rational(b, x, 4.0, _ERF_P, _ERF_Q)


_REWRITES = {"math.exp": _exp, "math.tanh": _tanh, "math.erf": _erf}

# Constant exponents whose power is computed without libm's powf (what ATen's pow by a
# scalar special-cases, so eager gives the same values): products for small integers,
# sqrt for halves, a division for negative ones.
_POWER_EXPONENTS = (-2.0, -1.0, -0.5, 0.5, 1.0, 2.0, 3.0, 4.0)


def _constant_exponent(op) -> Optional[float]:
    """The exponent of a math.powf whose exponent is a float constant from _POWER_EXPONENTS
    (GELU's tanh form cubes its input: x ** 3.0), else None."""
    constant = producer(op.operands[1], "arith.constant")
    if constant is None:
        return None
    value = ir.FloatAttr(constant.attributes["value"]).value
    return value if value in _POWER_EXPONENTS else None


def _power(b: _Builder, x, exponent: float):
    magnitude = abs(exponent)
    if magnitude == 0.5:
        result = math.SqrtOp(x).result
    else:   # x * x * ..., by squaring: x**3 is x * (x * x), as ATen's (x * x) * x
        result, square, n = None, x, int(magnitude)
        while n:
            if n & 1:
                result = square if result is None else b.mul(result, square)
            n >>= 1
            if n:
                square = b.mul(square, square)
    if exponent < 0:   # a plain division: x may be 0 (inf) or anything else
        result = arith.DivFOp(b.const(1.0), result).result
    return result


def approximate_math(module, scalef: bool = False) -> int:
    """Replaces every f32 math.exp/tanh/erf, and each math.powf by a constant exponent of
    _POWER_EXPONENTS, in `module`; returns how many. `scalef`: the host scales by powers
    of two in one vector instruction (AVX-512's vscalefps), so exp uses LLVM's ldexp,
    which elsewhere would become a libm call per element."""
    targets = []

    def visit(op):
        if not isinstance(op.results[0].type if op.results else None, ir.F32Type):
            return ir.WalkResult.ADVANCE
        if op.name in _REWRITES or (op.name == "math.powf" and
                                    _constant_exponent(op) is not None):
            targets.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    with module.context:
        builder = _Builder(scalef)
        for op in targets:
            with ir.InsertionPoint(op), op.location:
                if op.name == "math.powf":
                    value = _power(builder, op.operands[0], _constant_exponent(op))
                else:
                    value = _REWRITES[op.name](builder, op.operands[0])
            op.results[0].replace_all_uses_with(value)
            op.erase()
    return len(targets)


_REASSOCIABLE = ("arith.addf", "arith.mulf", "arith.maximumf", "arith.minimumf",
                 "arith.maxnumf", "arith.minnumf")


def allow_reduction_reassociation(module) -> int:
    """Lets LLVM vectorize floating-point reductions: the combining op in the body of each
    linalg reduction gets `fastmath<reassoc>`, which allows summing in several lanes and
    adding the lanes at the end (as PyTorch's own vectorized reductions do). Elementwise
    ops are untouched. Returns how many ops were marked."""
    marked = []

    def visit(op):
        if op.name == "linalg.generic" and not all_parallel(op):
            for inner in op.regions[0].blocks[0].operations:
                if inner.name in _REASSOCIABLE:
                    marked.append(inner)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    _add_fastmath(module, marked, "reassoc")
    return len(marked)


_CONTRACTIBLE = ("arith.addf", "arith.subf", "arith.mulf")


def allow_contraction(module) -> int:
    """Lets LLVM fuse a multiply and the add that consumes it into one fused multiply-add
    (`fastmath<contract>`, as C compilers do by default with -ffp-contract=fast): one
    rounding instead of two, so results move by at most an ulp, towards the exact value.
    Polynomial approximations and normalizations are chains of exactly this shape. Returns
    how many ops were marked."""
    marked = []

    def visit(op):
        if op.name in _CONTRACTIBLE:
            marked.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    _add_fastmath(module, marked, "contract")
    return len(marked)


def allow_reciprocal(module) -> int:
    """Lets LLVM divide by multiplying with a reciprocal: every f32 division gets
    `fastmath<arcp>`, so a softmax row divided by its sum becomes one division per row and a
    multiply per element, as in PyTorch's own softmax (at most an ulp or two apart, for
    denominators above FLT_MIN). Divisions whose operands are provably finite and whose
    denominator is provably away from 0 (`_interval`: a rational approximation's P/Q on a
    clamped input, as StableHLO's erf in GELU) also get `ninf`, which lets LLVM use the host's
    reciprocal estimate refined by one Newton step (blade.codegen.llvm.abi.tune_for_host)
    instead of a full-latency vector division; other divisions do not, as a model's own
    division may mean to produce an infinity. A division by a square root gets neither unless
    its operands are provably finite: `arcp` alone lets LLVM turn y / sqrt(x) into y times the
    reciprocal square root estimate, which is NaN where x is 0 or inf (1 / sqrt(0) must be
    inf). Returns how many divisions got `ninf`."""
    divisions, finite, memo = [], [], {}

    def visit(op):
        if op.name == "arith.divf" and isinstance(op.results[0].type, ir.F32Type):
            lo, hi = _interval(op.operands[1], memo)
            if _finite(*_interval(op.operands[0], memo)) and _finite(lo, hi) and \
                    (lo > 1e-30 or hi < -1e-30):
                finite.append(op)
                divisions.append(op)
            elif producer(op.operands[1], "math.sqrt") is None:
                divisions.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    _add_fastmath(module, divisions, "arcp")
    _add_fastmath(module, finite, "ninf")
    return len(finite)


_UNBOUNDED = (-float("inf"), float("inf"))
_MAXIMA = ("arith.maximumf", "arith.maxnumf")
_MINIMA = ("arith.minimumf", "arith.minnumf")


def _interval(value, memo) -> Tuple[float, float]:
    """Bounds of a scalar f32 `value` from the ops that compute it: constants, and
    max/min/add/sub/mul of bounded values (a clamp bounds anything); NaN aside. Anything
    else is unbounded."""
    owner = value.owner
    if isinstance(owner, ir.Block):
        return _UNBOUNDED
    if owner in memo:
        return memo[owner]
    name = owner.name
    result = _UNBOUNDED
    if name == "arith.constant" and isinstance(owner.attributes["value"], ir.FloatAttr):
        c = ir.FloatAttr(owner.attributes["value"]).value
        result = (c, c)
    elif name in _MAXIMA + _MINIMA + ("arith.addf", "arith.subf", "arith.mulf"):
        (a_lo, a_hi), (b_lo, b_hi) = (_interval(v, memo) for v in owner.operands)
        if name in _MAXIMA:
            result = (max(a_lo, b_lo), max(a_hi, b_hi))
        elif name in _MINIMA:
            result = (min(a_lo, b_lo), min(a_hi, b_hi))
        elif _finite(a_lo, a_hi) and _finite(b_lo, b_hi):
            if name == "arith.addf":
                result = (a_lo + b_lo, a_hi + b_hi)
            elif name == "arith.subf":
                result = (a_lo - b_hi, a_hi - b_lo)
            elif owner.operands[0] == owner.operands[1]:  # a square
                low = 0.0 if a_lo <= 0.0 <= a_hi else min(a_lo * a_lo, a_hi * a_hi)
                result = (low, max(a_lo * a_lo, a_hi * a_hi))
            else:
                products = [a_lo * b_lo, a_lo * b_hi, a_hi * b_lo, a_hi * b_hi]
                result = (min(products), max(products))
            if not _finite(*result):  # past float32's range: no bound worth keeping
                result = _UNBOUNDED
    memo[owner] = result
    return result


def _finite(lo: float, hi: float) -> bool:
    # with margin: float32 rounding of the bounds' arithmetic must not reach infinity
    return -1e30 < lo <= hi < 1e30


def fastmath_attribute(flags: arith.FastMathFlags):
    """The `#arith.fastmath<...>` attribute of `flags` (in the current context)."""
    return ir.AttrBuilder.get("arith.Arith_FastMathAttr")(flags, ir.Context.current)


def fastmath_sets():
    """Every `#arith.fastmath<...>` attribute (in the current context) with its flags: the
    bindings read no flags back, so an attribute's flags are those of the set that builds
    it (7 flags, 128 sets)."""
    single = [f for f in arith.FastMathFlags.__members__.values()
              if f.value and f.value & (f.value - 1) == 0]
    sets = {}
    for bits in range(1 << len(single)):
        flags = arith.FastMathFlags(0)
        for k, flag in enumerate(single):
            if bits >> k & 1:
                flags |= flag
        sets[fastmath_attribute(flags)] = flags
    return sets


def _add_fastmath(module, ops, flag: str) -> None:
    """Adds `flag` (a FastMathFlags member's name) to each op's fastmath flags, keeping
    those it has."""
    added = arith.FastMathFlags[flag]
    with module.context:
        sets = fastmath_sets() if ops else {}
        for op in ops:
            flags = sets[op.attributes["fastmath"]] if "fastmath" in op.attributes \
                else arith.FastMathFlags(0)
            op.attributes["fastmath"] = fastmath_attribute(flags | added)
