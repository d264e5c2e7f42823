"""Programs from Debian's packages that some tests drive for real (Chromium, HAProxy, docker-compose).

Where one is missing its tests skip, except in CI (CI set), where .ci/run installs them all and a
missing one must fail rather than pass unseen.
"""

import os
import shutil

import pytest


def require_tool(path: str, package: str) -> None:
    """Skips the test when `path` is not installed, or fails it in CI."""
    if shutil.which(path) is None:
        missing(f"{path} is not installed (apt-get install {package})")


def missing(message: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(message + ": .ci/run installs it")
    pytest.skip(message)
