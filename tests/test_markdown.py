"""The one markdown table helper: cells, column order and alignment."""

from __future__ import annotations

import pytest

from globaldl.markdown import markdown_table


def test_markdown_table_formats_floats_to_four_digits_and_leaves_none_empty() -> None:
    table = markdown_table([{"name": "a", "seconds": 1.234567, "note": None}])
    assert table == "| name | seconds | note |\n|---|---|---|\n| a | 1.235 |  |\n"


def test_markdown_table_takes_the_columns_asked_for_in_their_order() -> None:
    rows = [{"a": 1, "b": 2, "c": 3}, {"a": 4, "c": 6}]
    assert markdown_table(rows, ["c", "a"]) == "| c | a |\n|---|---|\n| 3 | 1 |\n| 6 | 4 |\n"


def test_markdown_table_right_aligns_the_columns_named() -> None:
    table = markdown_table([{"device": "d1", "ms": "1.0"}], right_aligned={"ms"})
    assert table.splitlines()[1] == "|---|---:|"


def test_markdown_table_refuses_to_align_a_column_it_does_not_have() -> None:
    with pytest.raises(ValueError, match=r"\['missing'\]"):
        markdown_table([{"a": 1}], right_aligned={"missing"})


def test_markdown_table_without_rows_says_so() -> None:
    assert markdown_table([]) == "(no rows)\n"
