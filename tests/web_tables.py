"""Reading what a console page shows, at one instant, for the browser tests.

The pages redraw their tables live, from the event stream. Reading a table one element at a time
(the rows, then each row's cells) can meet a row the redraw has just replaced: a stale element.
Each reader here reads what it needs in one script, which the page runs between two redraws.
"""

from __future__ import annotations

from typing import Any

_READ_ROWS = """
const [selector, key] = arguments;
return Array.from(document.querySelectorAll(selector), row => [
  key ? row.getAttribute(key) : null,
  Array.from(row.querySelectorAll("td"), cell => cell.innerText.trim()),
]);
"""


def _read_rows(driver: Any, selector: str, key: str | None) -> list[tuple[str | None, list[str]]]:
    """Each row ``selector`` matches: its ``key`` attribute (None when not asked) and its cells' text."""
    return [(k, list(cells)) for k, cells in driver.execute_script(_READ_ROWS, selector, key)]


def table_rows(driver: Any, selector: str) -> list[list[str]]:
    """The cells' text of each table row that ``selector`` matches, read at one instant."""
    return [cells for _, cells in _read_rows(driver, selector, None)]


def element_text(driver: Any, css: str) -> str:
    """The text of the first element ``css`` matches, read in one script."""
    shown = driver.execute_script(
        "const e = document.querySelector(arguments[0]); return e ? e.innerText.trim() : null;", css
    )
    assert shown is not None, f"nothing on the page matches {css}"
    return str(shown)


def workload_rows(driver: Any) -> dict[str, list[str]]:
    """The queue table's rows by workload (``namespace/name``): each one's cells' text."""
    return {str(k): cells for k, cells in _read_rows(driver, "tr[data-workload]", "data-workload")}
