"""Pages of a list of items: the window between the cursors, cut to `limit` from the side of
`after` (or, with `before` alone, from the side of `before`), in either order."""

import pytest

from openai_serve.errors import APIError
from openai_serve.item_pages import PageQuery, page

ITEMS = [{"id": f"i{n}"} for n in range(5)]  # oldest first


def ids(query: PageQuery) -> tuple[list[object], bool]:
    listed = page(ITEMS, query)
    data = listed["data"]
    assert listed["object"] == "list" and listed["first_id"] == (data[0]["id"] if data else None)  # type: ignore[index]
    assert listed["last_id"] == (data[-1]["id"] if data else None)  # type: ignore[index]
    return [item["id"] for item in data], listed["has_more"]  # type: ignore[union-attr, return-value]


@pytest.mark.parametrize(("query", "expected"), [
    (PageQuery(), (["i4", "i3", "i2", "i1", "i0"], False)),
    (PageQuery(limit=2), (["i4", "i3"], True)),
    (PageQuery(limit=2, after="i3"), (["i2", "i1"], True)),
    (PageQuery(limit=2, after="i1"), (["i0"], False)),
    (PageQuery(limit=2, order="asc", after="i1"), (["i2", "i3"], True)),
    (PageQuery(limit=2, order="asc", before="i3"), (["i1", "i2"], True)),
    (PageQuery(limit=2, before="i1"), (["i3", "i2"], True)),
    (PageQuery(order="asc", after="i1", before="i3"), (["i2"], False)),
    (PageQuery(order="asc", after="i4"), ([], False)),
])
def test_a_page_is_the_window_between_the_cursors_cut_to_the_limit(query: PageQuery, expected: tuple) -> None:
    assert ids(query) == expected


@pytest.mark.parametrize(("query", "param"), [
    ({"limit": "0"}, "limit"), ({"limit": "101"}, "limit"), ({"limit": "2.5"}, "limit"), ({"order": "up"}, "order"),
])
def test_a_bad_query_is_a_400_naming_the_field(query: dict[str, str], param: str) -> None:
    with pytest.raises(APIError) as error:
        PageQuery.read(query)
    assert error.value.status_code == 400 and error.value.param == param


def test_a_cursor_that_names_no_item_is_a_400_naming_it() -> None:
    for query, param in [(PageQuery(after="x"), "after"), (PageQuery(before="x"), "before")]:
        with pytest.raises(APIError) as error:
            page(ITEMS, query)
        assert error.value.param == param


def test_the_query_defaults_are_openais() -> None:
    assert PageQuery.read({}) == PageQuery(limit=20, order="desc", after=None, before=None)
    assert PageQuery.read({"limit": "100", "order": "asc", "after": "i1"}) == PageQuery(100, "asc", "i1", None)
