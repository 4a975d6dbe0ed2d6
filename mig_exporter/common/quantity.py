"""Kubernetes quantities (`7680Mi`, `8Gi`, `1500M`, `0.5`) as numbers.

Written here, not taken from the `kubernetes` client's `utils.parse_quantity`: the pure modules
that read quantities (a pod's NvFractions annotations, a claim's consumed capacity) may not import
the client (the import contract in pyproject.toml), and that function takes `nan`, `inf` and
numbers of any size, none of which is a quantity the API would hold.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

# <signed number><suffix>, the suffix binary, decimal SI, or a decimal exponent (`1e3`): the API's
# grammar (apimachinery's quantity.go), with the exponent kept to two digits.
_FORM = re.compile(
    r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)|[eE]([+-]?[0-9]{1,2}))?"
)
_SCALE: dict[str, Decimal] = {
    **{s: Decimal(2) ** (10 * (i + 1)) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
    **{
        s: Decimal(10) ** (3 * i)
        for i, s in enumerate(("n", "u", "m", "", "k", "M", "G", "T", "P", "E"), -3)
    },
}
_MIB = 2**20


def parse(text: object) -> Decimal:
    """The quantity's value; ValueError, saying what a quantity looks like, if it is none."""
    found = _FORM.fullmatch(text.strip()) if isinstance(text, str) and len(text) < 64 else None
    if found is None:
        raise ValueError(f"expected a Kubernetes quantity such as 7680Mi or 8Gi, got {text!r}")
    try:
        exponent = Decimal(10) ** int(found[3]) if found[3] else 1
        return Decimal(found[1]) * _SCALE[found[2] or ""] * exponent
    except InvalidOperation:  # pragma: no cover - the pattern admits only plain decimals
        raise ValueError(f"expected a Kubernetes quantity, got {text!r}") from None


def mib(text: object) -> int:
    """A memory quantity in whole MiB, rounded down (bytes: `7680Mi` is 7680, `1500M` 1430)."""
    value = parse(text)
    if value < 0:
        raise ValueError(f"expected a quantity of memory of at least 0, got {text!r}")
    return int(value // _MIB)
