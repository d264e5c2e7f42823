"""Finding tags (`<tool_call>`, `</think>`) in text that arrives in pieces."""


def held_back(text: str, tag: str) -> int:
    """How many characters at the end of `text` might be the start of `tag`: they wait for the next
    piece before anyone may show them."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0


def split_at_tag(text: str, tag: str) -> tuple[str, str | None, str]:
    """(before, tag or None, after): `text` up to the first `tag`, or up to what might start one.
    Without a tag, `after` is what is held back."""
    index = text.find(tag)
    if index >= 0:
        return text[:index], tag, text[index + len(tag):]
    keep = held_back(text, tag)
    return text[:len(text) - keep], None, text[len(text) - keep:]


def split_at_any(text: str, tags: tuple[str, ...]) -> tuple[str, str | None, str]:
    """`split_at_tag` for whichever of `tags` comes first (at one place, the longest)."""
    found = [(index, -len(tag), tag) for tag in tags if (index := text.find(tag)) >= 0]
    if found:
        index, _, tag = min(found)
        return text[:index], tag, text[index + len(tag):]
    keep = max(held_back(text, tag) for tag in tags)
    return text[:len(text) - keep], None, text[len(text) - keep:]
