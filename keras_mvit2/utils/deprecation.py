"""Renamed arguments: the old name keeps working for one release, with a warning naming the new."""

from __future__ import annotations

import warnings
from typing import Any

#: The release that removes the old names.
REMOVED_IN = "0.4.0"


def renamed_argument(function: str, old: str, old_value: Any, new: str, new_value: Any,
                     default: Any = None) -> tuple[Any, str]:
    """The value of an argument renamed from `old` to `new`, and the name the caller used.

    `old_value` / `new_value` are what the caller passed under each name (None: not
    passed). Passing the old name warns (`DeprecationWarning`, pointing at the caller's
    caller) and names the new one; passing both is an error.

    Returns:
        `(value, name)`: the value (or `default`), and `old` or `new` for error messages.
    """
    if old_value is None:
        return (default if new_value is None else new_value), new
    if new_value is not None:
        raise TypeError(f"{function}() got both {old}= and its new name {new}=; pass {new}= only.")
    warnings.warn(
        f"{function}({old}=...) is deprecated and will be removed in keras_mvit2 {REMOVED_IN}; "
        f"use {new}=... (the same values).",
        DeprecationWarning,
        stacklevel=3,
    )
    return old_value, old
