"""The stop-string automaton against the obvious search (every stop string at every chunk), and its
cost: linear in the text whatever the number of stop strings."""

import time

from hypothesis import given, settings
from hypothesis import strategies as st

from core.stop_strings import StopStringScanner, compile_stop_strings


def naive_first_stop(chunks: list[str], stops: list[str]) -> tuple[int, int, str] | None:
    """(chunk index, start in the whole text, stop) of the earliest-starting stop string present once the
    first chunk that completes any has arrived."""
    text = ""
    for i, chunk in enumerate(chunks):
        text += chunk
        hits = sorted((text.find(s), len(s), s) for s in stops if s in text)
        if hits:
            return i, hits[0][0], hits[0][2]
    return None


def naive_held(text: str, stops: list[str], limit: int) -> int:
    return max([n for s in stops for n in range(1, min(len(s) - 1, limit) + 1) if text.endswith(s[:n])], default=0)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(alphabet="abc🚀", max_size=4), max_size=8),
       st.lists(st.text(alphabet="abc🚀", min_size=1, max_size=4), min_size=1, max_size=5))
def test_finds_what_the_obvious_search_finds(chunks: list[str], stops: list[str]) -> None:
    scanner = StopStringScanner(stops)
    text = ""
    expected = naive_first_stop(chunks, stops)
    for i, chunk in enumerate(chunks):
        found = scanner.scan(chunk)
        if found is not None:
            start, stop = found
            assert expected is not None and (i, len(text) + start) == expected[:2]
            assert text[len(text) + start:] + chunk[: start + len(stop)] == stop or (text + chunk)[
                len(text) + start : len(text) + start + len(stop)] == stop
            return
        text += chunk
        for limit in (0, 1, 2, len(text)):
            assert scanner.held(limit) == naive_held(text, stops, limit)
    assert expected is None


def test_the_earliest_start_wins_then_the_shortest() -> None:
    assert StopStringScanner(["four", "two"]).scan("one two three four") == (4, "two")
    assert StopStringScanner(["bc", "abcd"]).scan("abcd") == (0, "abcd")  # both end in it: abcd starts first
    scanner = StopStringScanner(["bc", "abcd"])
    assert scanner.scan("ab") is None and scanner.held(2) == 2
    assert scanner.scan("c") == (-1, "bc")  # began in text fed before
    assert StopStringScanner(["abc", "ab"]).scan("abc") == (0, "ab")


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
