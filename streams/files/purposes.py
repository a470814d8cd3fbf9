"""What an upload's ``purpose`` allows, and the checks a purpose makes of its file's content.

A purpose may register a validator that reads the stored file and raises :class:`InvalidFile` naming the
problem (the batch API checks that a purpose="batch" file is JSONL of requests, by line number), without
editing the files store::

    from streams.files.purposes import InvalidFile, register_validator

    def check_batch_file(path: Path, filename: str) -> None:
        ...
        raise InvalidFile(f"line {n}: 'custom_id' is missing")

    register_validator("batch", check_batch_file)

Validators run in a thread, after the bytes are stored and before the file is published; a rejected file is
removed and the upload answers 400 with the message.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from schemas.documents import UPLOAD_PURPOSES

PurposeValidator = Callable[[Path, str], None]  # (stored file, its name) -> None, or raise InvalidFile

_validators: dict[str, PurposeValidator] = {}


class InvalidFile(Exception):
    """The file's content does not suit its purpose; the message says where and why."""

    def __init__(self, message: str, *, param: str = "file") -> None:
        super().__init__(message)
        self.message = message
        self.param = param


def register_validator(purpose: str, validator: PurposeValidator) -> None:
    """Check every uploaded file of ``purpose`` with ``validator`` (replacing an earlier one)."""
    if purpose not in UPLOAD_PURPOSES:
        raise ValueError(f"{purpose!r} is not an upload purpose ({', '.join(UPLOAD_PURPOSES)})")
    _validators[purpose] = validator


def unregister_validator(purpose: str) -> None:
    _validators.pop(purpose, None)


def validator_for(purpose: str) -> PurposeValidator | None:
    return _validators.get(purpose)


def check_upload_purpose(purpose: str) -> str | None:
    """None when clients may upload files for ``purpose``; else what is wrong, for a 400 naming `purpose`."""
    if purpose in UPLOAD_PURPOSES:
        return None
    return f"Invalid value for 'purpose': {purpose!r}. Supported values are: {', '.join(UPLOAD_PURPOSES)}."
