"""Names from the outside that become one component of a file path or object name.

A train request's ``request_id`` becomes a directory of the trainer's work folder, a model version a
folder of the model cache and the prefix of its Object Store names, a manifest's file names the files of
that folder. Each must be one plain component: a letter or digit, then up to 127 letters, digits, ``.``,
``_`` or ``-``, and no ``..`` anywhere, so it can never name a parent, an absolute path or a hidden file.
"""

from __future__ import annotations

import re

PATH_COMPONENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def is_path_component(name: object) -> bool:
    return isinstance(name, str) and PATH_COMPONENT.fullmatch(name) is not None and ".." not in name


def check_path_component(name: object, what: str) -> str:
    """``name`` when it is one safe path component, else ValueError saying what was refused (shown with
    ``repr``, cut to 80 characters, so a log line stays one line)."""
    if not is_path_component(name):
        shown = repr(name)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        raise ValueError(f"{what} {shown} is not a safe path component (1-128 of A-Z a-z 0-9 . _ -, starting "
                         f"with a letter or digit, no '..')")
    return name
