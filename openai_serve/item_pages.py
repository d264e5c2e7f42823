"""One page of a list of items, as OpenAI's cursor-paginated list endpoints answer: `object: "list"`,
`data`, `first_id`, `last_id`, `has_more`; read from the query `limit` (1-100, default 20),
`order` (`asc` or `desc`, default `desc`: the last item first) and the cursors `after` and
`before` (item ids: the page holds the items that follow `after` and precede `before`, in `order`).

With `before` alone the page is the `limit` items nearest to it (the page before it), still in
`order`; otherwise the first `limit` that follow `after`. `has_more` says that the window between
the cursors holds more than the page. A cursor that names no item of the list is a 400 naming it
(OpenAI's SDK only ever sends ids it was given).
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from openai_serve.errors import bad_request

MAX_LIMIT = 100
ORDERS = ("asc", "desc")


@dataclass(frozen=True)
class PageQuery:
    limit: int = 20
    order: str = "desc"
    after: str | None = None
    before: str | None = None

    @classmethod
    def read(cls, query: Mapping[str, str]) -> "PageQuery":
        order = query.get("order", "desc")
        if order not in ORDERS:
            raise bad_request(f"'order' must be one of {', '.join(ORDERS)}, got {order!r}", "order")
        return cls(_read_limit(query.get("limit")), order, query.get("after"), query.get("before"))


def _read_limit(value: str | None) -> int:
    if value is None:
        return PageQuery.limit
    try:
        limit: int | None = int(value)
    except ValueError:
        limit = None
    if limit is None or not 1 <= limit <= MAX_LIMIT:
        raise bad_request(f"'limit' must be an integer from 1 to {MAX_LIMIT}, got {value!r}", "limit")
    return limit


def page(items: Sequence[dict[str, object]], query: PageQuery) -> dict[str, object]:
    """The page of `items` (oldest first, each with an `id`) that `query` asks for."""
    ordered = list(items) if query.order == "asc" else list(reversed(items))
    ids = [item["id"] for item in ordered]
    start = 0 if query.after is None else _position(ids, query.after, "after") + 1
    end = len(ordered) if query.before is None else _position(ids, query.before, "before")
    window = ordered[start:end]
    is_before_only = query.before is not None and query.after is None
    data = window[-query.limit:] if is_before_only else window[:query.limit]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": len(window) > len(data)}


def _position(ids: list[object], cursor: str, param: str) -> int:
    if cursor not in ids:
        raise bad_request(f"'{param}' must be the id of an item of this list, got {cursor!r}", param)
    return ids.index(cursor)
