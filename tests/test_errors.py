"""tunefleet.errors.one_line: what an error message quotes from a library or a child process."""

from __future__ import annotations

from tunefleet.errors import one_line


def test_one_line_collapses_whitespace_bounds_the_length_and_names_a_silent_exception() -> None:
    assert one_line("first\n  second\tthird") == "first second third"
    long = one_line("x" * 1000, limit=20)
    assert len(long) == 20 and long.endswith("...")
    assert one_line(OSError()) == "OSError"
    assert one_line("") == ""
    assert one_line(ValueError("bad\nvalue")) == "bad value"
