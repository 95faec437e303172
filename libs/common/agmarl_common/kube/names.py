"""Kubernetes object names, checked before one goes into an API path, a request body or a subject token.

As apimachinery's ``IsDNS1123Label`` / ``IsDNS1123Subdomain`` (``pkg/util/validation``): a DNS-1123 label is
1-63 lowercase letters, digits and ``-``, starting and ending with a letter or digit (a namespace; the
cluster name and the batch scheduler's name under ``agmarl up``); a DNS-1123 subdomain is such labels joined
by ``.``, at most 253 characters in all (a pod or node name).
"""

from __future__ import annotations

import re

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
FORMATS = {"label": (re.compile(_LABEL), 63), "subdomain": (re.compile(rf"{_LABEL}(\.{_LABEL})*"), 253)}
FORMAT_OF = {"namespace": "label", "pod": "subdomain", "node": "subdomain"}  # what each kind of name must be


class InvalidName(ValueError):
    """A name Kubernetes would never accept for what it names."""


def is_dns1123(value: object, fmt: str = "label") -> bool:
    """``value`` is a DNS-1123 ``fmt`` ("label" or "subdomain")."""
    pattern, longest = FORMATS[fmt]
    return isinstance(value, str) and len(value) <= longest and pattern.fullmatch(value) is not None


def check_name(what: str, value: object) -> str:
    """``value`` when it is a valid name for a ``what`` (namespace, pod or node), else ``InvalidName``."""
    fmt = FORMAT_OF[what]
    if not is_dns1123(value, fmt):
        raise InvalidName(f"invalid {what} name {value!r} (not a DNS-1123 {fmt})")
    return value
