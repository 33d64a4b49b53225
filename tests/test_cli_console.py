"""What the terminal gets when its reader goes away: `python train.py | head`."""

from __future__ import annotations

import io
import logging
import sys

from lipt.core.console import TerminalHandler


class GonePipe(io.StringIO):
    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_a_closed_pipe_on_stdout_ends_the_terminal_lines_quietly(monkeypatch, capsys):
    # each stage line after `head` quit was a "--- Logging error ---" traceback on stderr
    monkeypatch.setattr(sys, "stdout", GonePipe())
    handler = TerminalHandler()
    record = logging.LogRecord("lipt.stages.train", logging.INFO, __file__, 1, "training", (), None)
    handler.handle(record)
    assert capsys.readouterr().err == ""


def test_other_write_errors_are_still_reported(monkeypatch, capsys):
    class Broken(io.StringIO):
        def write(self, text: str) -> int:
            raise OSError(5, "Input/output error")

    monkeypatch.setattr(sys, "stdout", Broken())
    record = logging.LogRecord("lipt", logging.INFO, __file__, 1, "x", (), None)
    TerminalHandler().handle(record)
    assert "Logging error" in capsys.readouterr().err
