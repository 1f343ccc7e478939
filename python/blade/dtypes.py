"""Blade's dtypes, as data: each dtype's names, and the dtype constraints of every op Blade
compiles, each in one table.

`DTYPES` names each dtype once: its torch dtype, Blade's name (reports, tensor specs, the
command line), TorchScript's ScalarType and the torch dialect's element type; every other
lookup derives from it, and the C++ runtime's spec names are checked against it
(tests/test_cli.py).

`DTYPE_TABLE` says, per op and per tensor argument of the op's schema (by name, ``*`` for
the rest), which dtypes the compiled code accepts, and what dtype the result has: a dtype
name (comparisons give ``"bool"``), ``"same"`` (one of the argument dtypes, after PyTorch's
type promotion) or ``"any"`` (casts and factories: any dtype Blade compiles). "Is this op
supported for these dtypes" has exactly one answer, `check_dtypes`.
"""
from dataclasses import dataclass, field
from typing import Dict, Optional, Sequence, Tuple

import torch


@dataclass(frozen=True)
class Dtype:
    """One dtype under all the names it goes by in Blade."""

    torch: torch.dtype
    name: str                 # Blade's: reports, tensor specs, the dtype table, the CLI
    scalar_type: str          # TorchScript's (TensorType.scalarType())
    element: str              # the torch dialect's element type
    aliases: Tuple[str, ...] = ()  # other names the command line takes


# The dtypes Blade names.
DTYPES = (
    Dtype(torch.float32, "float32", "Float", "f32", ("float",)),
    Dtype(torch.float64, "float64", "Double", "f64", ("double",)),
    Dtype(torch.float16, "float16", "Half", "f16", ("half",)),
    Dtype(torch.bfloat16, "bfloat16", "BFloat16", "bf16"),
    Dtype(torch.int64, "int64", "Long", "si64", ("long",)),
    Dtype(torch.int32, "int32", "Int", "si32", ("int",)),
    Dtype(torch.int16, "int16", "Short", "si16"),
    Dtype(torch.int8, "int8", "Char", "si8"),
    Dtype(torch.uint8, "uint8", "Byte", "ui8"),
    Dtype(torch.bool, "bool", "Bool", "i1"),
)
DTYPE_NAMES = {d.torch: d.name for d in DTYPES}              # torch.float32 -> "float32"
SCALAR_TYPE_NAMES = {d.scalar_type: d.name for d in DTYPES}  # "Float" -> "float32"
ELEMENT_TYPES = {d.scalar_type: d.element for d in DTYPES}   # "Float" -> "f32"
# "float32" and "float" -> torch.float32
BY_NAME = {name: d.torch for d in DTYPES for name in (d.name, *d.aliases)}

F32 = ("float32",)
BOOL = ("bool",)
FLOATS = ("float32", "float64", "float16", "bfloat16")
# What PyTorch takes as indices (gather, scatter, embedding).
INDICES = ("int64", "int32")
# uint8 is unsigned in the compiled code too (codegen/stablehlo/unsigned.py).
INTS = INDICES + ("int16", "int8", "uint8")
NUMERIC = FLOATS + INTS
ALL = NUMERIC + BOOL


@dataclass(frozen=True)
class DtypeRule:
    args: Dict[str, Tuple[str, ...]] = field(default_factory=lambda: {"*": F32})
    result: str = "same"


FLOAT_SAME = DtypeRule(args={"*": FLOATS})
NUMERIC_SAME = DtypeRule(args={"*": NUMERIC})
ALL_SAME = DtypeRule(args={"*": ALL})
# Comparisons give bools.
NUMERIC_TO_BOOL = DtypeRule(args={"*": NUMERIC}, result="bool")
BOOL_SAME = DtypeRule(args={"*": BOOL})
ANY_RESULT = DtypeRule(args={"*": ALL}, result="any")

# Keyed by exact overload. Families are listed together; see blade/partition/converters/.
DTYPE_TABLE: Dict[str, DtypeRule] = {}


def define(schemas: Sequence[str], rule: DtypeRule) -> None:
    for schema in schemas:
        DTYPE_TABLE[schema] = rule


def dtype_name(dtype: Optional[torch.dtype]) -> str:
    """`float32` for torch.float32; dtypes Blade does not compile by torch's name too
    (`complex64`)."""
    return DTYPE_NAMES.get(dtype, str(dtype).replace("torch.", ""))


def check_dtypes(schema_name: str, arg_dtypes: Dict[str, str], result_dtypes: Sequence[str],
                 rule: Optional[DtypeRule] = None) -> Optional[str]:
    """Returns None when the dtypes are allowed, else the reason they are not."""
    rule = rule or DTYPE_TABLE.get(schema_name)
    if rule is None:
        return f"{schema_name} has no entry in the dtype table"
    for arg, dtype in arg_dtypes.items():
        allowed = rule.args.get(arg, rule.args.get("*", ()))
        if dtype not in allowed:
            return (f"{schema_name}: argument '{arg}' has dtype {dtype}, the dtype table "
                    f"allows {', '.join(allowed) or 'none'}")
    if rule.result == "any":
        allowed_results = ALL
    elif rule.result == "same":
        allowed_results = tuple(d for ds in rule.args.values() for d in ds)
    else:
        allowed_results = (rule.result,)
    for dtype in result_dtypes:
        if dtype not in allowed_results:
            return (f"{schema_name}: result has dtype {dtype}, the dtype table allows "
                    f"{', '.join(dict.fromkeys(allowed_results))}")
    return None
