"""openai-serve: an OpenAI-compatible streaming server over the engine in `core`."""

from importlib.metadata import PackageNotFoundError, version


def _installed_version() -> str:
    try:
        return version("openai-serve")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "0.0.0+unknown"


__version__ = _installed_version()
