"""Kubernetes quantities, timestamps and the small dict readers the ``kubeconvert`` modules share.

Quantities ("500m", "1Gi", "2", "1e3", "0.5", 2) are parsed exactly (``parse_quantity`` ->
Fraction); cpu becomes milli-cpu rounded up (Quantity.MilliValue); memory and ephemeral storage
become MiB (``mib``; the caller says which way to round). Errors raise ``KubeConvertError``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from fractions import Fraction
from typing import Any

GPU_RESOURCE = "nvidia.com/gpu"
MIB = 1 << 20


class KubeConvertError(ValueError):
    """A Kubernetes object this module cannot turn into the model (the message says where)."""


# ---------------------------------------------------------------------------------------------
# Quantities

_QUANTITY = re.compile(r"^([+-]?)(\d+\.?\d*|\.\d+)([eE][+-]?\d+|Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")
_SUFFIX = {None: Fraction(1), "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000),
           "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9), "T": Fraction(10**12),
           "P": Fraction(10**15), "E": Fraction(10**18), "Ki": Fraction(2**10), "Mi": Fraction(2**20),
           "Gi": Fraction(2**30), "Ti": Fraction(2**40), "Pi": Fraction(2**50), "Ei": Fraction(2**60)}


def parse_quantity(value: str | int | float) -> Fraction:
    """A resource.Quantity ("500m", "1Gi", "1e3", "1.5", 2) as an exact Fraction of base units."""
    if isinstance(value, bool):
        raise KubeConvertError(f"quantity {value!r} is not a number")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise KubeConvertError(f"quantity {value!r} is not finite")
        return Fraction(str(value))
    if not isinstance(value, str):
        raise KubeConvertError(f"quantity {value!r} is not a string or number")
    m = _QUANTITY.match(value.strip())
    if m is None:
        raise KubeConvertError(f"quantity {value!r} is not a Kubernetes quantity")
    sign, number, suffix = m.groups()
    amount = Fraction(number)
    if suffix in _SUFFIX:
        amount *= _SUFFIX[suffix]
    else:  # decimal exponent: e3, E-2, e+1
        amount *= Fraction(10) ** int(suffix[1:])
    return -amount if sign == "-" else amount


def cpu_milli(value: str | int | float | Fraction) -> int:
    """Milli-cpu, rounded up (Quantity.MilliValue): "100m" -> 100, "0.5" -> 500, "1.0001" -> 1001."""
    q = value if isinstance(value, Fraction) else parse_quantity(value)
    return math.ceil(q * 1000)


def mib(value: str | int | float | Fraction, round_up: bool = True) -> int:
    """Bytes -> MiB: "1Gi" -> 1024; "1G" (953.67 MiB) -> 954 rounded up, 953 rounded down."""
    q = value if isinstance(value, Fraction) else parse_quantity(value)
    return math.ceil(q / MIB) if round_up else math.floor(q / MIB)


def count(value: str | int | float | Fraction) -> int:
    """An integer resource (pods, GPUs), rounded up as Quantity.Value does."""
    q = value if isinstance(value, Fraction) else parse_quantity(value)
    return math.ceil(q)


# ---------------------------------------------------------------------------------------------
# Small readers

def _get(obj: Mapping[str, Any] | None, *path: str) -> Any:
    cur: Any = obj
    for key in path:
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(key)
    return cur


def _str_map(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise KubeConvertError(f"{where}: expected a map, got {type(value).__name__}")
    return {str(k): "" if v is None else str(v) for k, v in value.items()}


def _list(value: Any, where: str) -> list:
    if value is None:
        return []
    if not isinstance(value, list):
        raise KubeConvertError(f"{where}: expected a list, got {type(value).__name__}")
    return value


def _resources(values: Any, where: str) -> dict[str, Fraction]:
    return {str(k): parse_quantity(v) for k, v in _str_map_raw(values, where).items()}


def _str_map_raw(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise KubeConvertError(f"{where}: expected a map, got {type(value).__name__}")
    return dict(value)


def _first(mapping: Mapping[str, str], keys: Sequence[str]) -> str | None:
    for k in keys:
        if mapping.get(k):
            return mapping[k]
    return None


def parse_time(value: Any) -> float:
    """RFC 3339 timestamp ("2026-11-29T17:53:35Z") -> epoch seconds; absent -> 0.0."""
    if not value:
        return 0.0
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise KubeConvertError(f"timestamp {value!r} is not RFC 3339") from None

