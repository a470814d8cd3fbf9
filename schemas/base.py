"""The base of every event on the bus (its own module so event modules can import it without cycles)."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 1


class Event(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = Field(
        default=SCHEMA_VERSION, description="Version of this event's schema; consumers reject versions they do not know."
    )
