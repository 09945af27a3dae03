"""Settings given as text (environment variables): one parser for whole numbers, with the rule in the error."""
from __future__ import annotations

from typing import Optional

from resources.errors import InvalidSetting


def whole_number(text: Optional[str], name: str, minimum: int) -> Optional[int]:
    """``text`` as a whole number of at least ``minimum``; empty or None -> None (the caller's default)."""
    if text is None or not text.strip():
        return None
    try:
        value = int(text.strip())
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise InvalidSetting(f"{name} must be a whole number of at least {minimum}, got {text!r}")
    return value
