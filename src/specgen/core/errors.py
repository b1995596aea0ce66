"""Exceptions that carry a one-line, actionable message.

cli/errors.py turns these into a line on stderr and an exit code; nothing else prints them.
Raise them with the message a user needs: what is wrong and what to change.
"""

from __future__ import annotations


class SpecgenError(Exception):
    exit_code = 1

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint


class UsageError(SpecgenError):
    """Bad command-line input: exit code 2."""

    exit_code = 2


class ProfileError(SpecgenError):
    """A profile that cannot be found, parsed or validated: exit code 2."""

    exit_code = 2


class ModelError(SpecgenError):
    """A checkpoint that cannot be loaded or a draft that does not fit the target: exit code 1."""


class DecodeError(SpecgenError):
    """A failure during generation (NaN logits, out of memory, ...): exit code 1."""
