"""The rich console the `mvit2` commands print their tables and lines with.

rich lays everything out for 80 columns when standard output is not a terminal (a file, a
pipe, a CI log), so a summary table there wraps every cell over several lines and cuts
paths with an ellipsis. `output_console` keeps rich's own console in a terminal (and a
notebook) and, anywhere else, prints lines unwrapped (`soft_wrap`, as `mvit2 finetune`
prints its paths) and each table at its full natural width, however wide.

```python
console = output_console()
console.print(table)          # `mvit2 demo > demo.log`: one table row per line
```
"""

from __future__ import annotations

from typing import Any

__all__ = ["LOG_WIDTH", "output_console"]

#: The width off a terminal: wider than any table we print, so none is squeezed. Tables
#: do not expand to it (rich draws a table at its natural width unless `expand=True`).
LOG_WIDTH = 10_000


def output_console() -> Any:
    """A `rich.console.Console` for a command's output.

    Returns:
        rich's own `Console()` on a terminal or in a notebook; otherwise one of width
        `LOG_WIDTH` whose `print` soft-wraps by default: no line is broken and every table
        prints at its natural width, one row per line.
    """
    from rich.console import Console

    console = Console()
    if console.is_terminal or console.is_jupyter:
        return console
    return Console(width=LOG_WIDTH, soft_wrap=True)
