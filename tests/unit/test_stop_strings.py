"""The stop-string automaton against the obvious search (every stop string at every character), and its
cost: linear in the text whatever the number of stop strings."""

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.stop_strings import StopStringScanner, compile_stop_strings


def first_stop(text: str, stops: list[str]) -> tuple[int, str] | None:
    """(start, stop) of the first stop string to complete, reading `text` a character at a time (of those
    completing at the same character, the longest), or None."""
    for end in range(1, len(text) + 1):
        completed = [stop for stop in stops if text.endswith(stop, 0, end)]
        if completed:
            stop = max(completed, key=len)
            return end - len(stop), stop
    return None


def naive_held(text: str, stops: list[str], limit: int) -> int:
    return max([n for s in stops for n in range(1, min(len(s) - 1, limit) + 1) if text.endswith(s[:n])], default=0)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(alphabet="abc🚀", max_size=4), max_size=8),
       st.lists(st.text(alphabet="abc🚀", min_size=1, max_size=4), min_size=1, max_size=5))
def test_finds_what_the_obvious_search_finds(chunks: list[str], stops: list[str]) -> None:
    """However the text is cut into chunks: the same stop string, found in the chunk where it completes."""
    scanner = StopStringScanner(stops)
    expected = first_stop("".join(chunks), stops)
    text = ""
    for chunk in chunks:
        found = scanner.scan(chunk)
        if found is not None:
            start, stop = found
            assert (len(text) + start, stop) == expected
            assert len(text) < len(text) + start + len(stop) <= len(text) + len(chunk)
            return
        text += chunk
        for limit in (0, 1, 2, len(text)):
            assert scanner.held(limit) == naive_held(text, stops, limit)
    assert expected is None


def test_the_first_to_complete_wins_then_the_longest() -> None:
    assert StopStringScanner(["four", "two"]).scan("one two three four") == (4, "two")
    assert StopStringScanner(["bc", "abcd"]).scan("abcd") == (1, "bc")  # abcd starts first, but bc ends first
    assert StopStringScanner(["abcd", "bc"]).scan("abcd") == (1, "bc")  # whatever the list's order
    scanner = StopStringScanner(["bc", "abcd"])
    assert scanner.scan("ab") is None and scanner.held(2) == 2
    assert scanner.scan("c") == (-1, "bc")  # began in text fed before
    assert StopStringScanner(["abc", "ab"]).scan("abc") == (0, "ab")
    assert StopStringScanner(["c", "abc"]).scan("abc") == (0, "abc")  # both complete at c: the longest
    scanner = StopStringScanner([" ", "a 🚀"])
    assert scanner.scan("a") is None and scanner.scan(" 🚀") == (0, " ")  # the space completed before the rocket


@pytest.mark.alone  # it compares two timings
def test_time_is_linear_in_the_text_whatever_the_number_of_stop_strings() -> None:
    text = "the quick brown fox jumps over the lazy dog " * 200
    few, many = ["zebra"], [f"zebra{i}" for i in range(2000)]
    compile_stop_strings(tuple(many))  # built once per set of stop strings, then cached

    def scan_time(stops: list[str]) -> float:
        started = time.perf_counter()
        scanner = StopStringScanner(stops)
        for i in range(0, len(text), 4):  # about a token at a time
            assert scanner.scan(text[i : i + 4]) is None
            scanner.held(8)
        return time.perf_counter() - started

    assert scan_time(many) < 3 * scan_time(few) + 0.01
