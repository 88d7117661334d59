"""A job's or a batch's metadata: a dict of JSON, at most METADATA_MAX_BYTES of it."""

from __future__ import annotations

from typing import Any

from ..conf import jobs_settings
from ..database.validation import json_dict


def metadata_text(value: Any, name: str = "metadata") -> str | None:
    """``value`` (a dict, or None) as the JSON text stored, within METADATA_MAX_BYTES."""
    if value is None:
        return None
    return json_dict(name, value, int(jobs_settings.METADATA_MAX_BYTES), "METADATA_MAX_BYTES")
