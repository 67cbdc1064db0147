"""Turns the library's user-facing errors into one line on stderr and a non-zero exit."""
from __future__ import annotations

import contextlib
import sys


def user_error_types() -> tuple[type[BaseException], ...]:
    from serve.config import ConfigError
    from serve.demo_target import FetchError
    from serve.target import TargetError

    types: list[type[BaseException]] = [ConfigError, FetchError, TargetError, FileNotFoundError]
    try:
        from serve.errors import DraftsmithError
        types.append(DraftsmithError)
    except ImportError:
        pass
    return tuple(types)


@contextlib.contextmanager
def user_errors():
    types = user_error_types()
    try:
        yield
    except types as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
