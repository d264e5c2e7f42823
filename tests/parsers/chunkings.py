"""Ways one recorded answer can reach a parser as a stream: whole, a character at a time, in pieces of a
few characters, cut inside every tag, cut at random, and as UTF-8 bytes cut anywhere and decoded as the
server decodes them. The conformance suites feed each to the parsers and compare with the answer in full."""

import codecs
import random
import re

_TAG_CHARACTERS = re.compile(r"[<>\[\]|｜▁=]")


def chunkings(text: str) -> dict[str, list[str]]:
    """Ways the same text can reach the parser."""
    ways = {"whole": [text], "characters": list(text)}
    for size in (2, 3, 5, 7):
        ways[f"every {size}"] = [text[i:i + size] for i in range(0, len(text), size)]
    ways["inside tags"] = cut(text, [m.start() + 1 for m in _TAG_CHARACTERS.finditer(text)])
    generator = random.Random(text)
    for n in range(12):
        ways[f"random {n}"] = cut(text, generator.sample(range(1, len(text)), min(len(text) - 1, 1 + n * 3)))
    ways["utf-8 bytes"] = _bytes_decoded(text, generator)
    return ways


def cut(text: str, cuts: list[int]) -> list[str]:
    points = sorted({0, len(text), *cuts})
    return [text[a:b] for a, b in zip(points, points[1:], strict=False)]


def _bytes_decoded(text: str, generator: random.Random) -> list[str]:
    """The text's UTF-8 bytes cut 1-3 bytes at a time, each piece decoded as far as whole characters go (the
    server never sends half a character: it waits for the rest)."""
    data, decoder, pieces, i = text.encode(), codecs.getincrementaldecoder("utf-8")(), [], 0
    while i < len(data):
        step = generator.randint(1, 3)
        pieces.append(decoder.decode(data[i:i + step], final=i + step >= len(data)))
        i += step
    return [piece for piece in pieces if piece] or [""]
