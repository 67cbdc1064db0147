"""The one line a failing command prints, read the way a user sees it (tests of bad input at the command line)."""
from __future__ import annotations

import pytest

from draftsmith.cli import main


def cli_error(capsys, *argv, code: int = 2) -> str:
    """Run `draftsmith ARGV` in process; assert it exits `code` without a traceback; its last stderr line."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in argv])
    assert exit_info.value.code == code
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return err.rstrip("\n").split("\n")[-1]  # transformers' loading bar may precede it
