"""Which names are allowed.

Names of topics, producers and consumers (:func:`validate_name`) are safe as a key segment
and a file name on every store, and cannot pass for another name on screen: 1-128
characters (at most 240 bytes of UTF-8) that are letters and digits of any script
(``orders``, ``заказы``, ``注文``), combining marks after them, and ASCII ``.``, ``_``, ``-``;
the first is a letter or digit, ``..`` does not occur, and NFKC normalisation leaves the name
unchanged. So slashes and their lookalikes (fullwidth solidus U+FF0F, division slash
U+2215), dot lookalikes (one-dot leader U+2024), backslashes, spaces, control and format
characters (such as the right-to-left override U+202E), overlay marks and blank letters
(Hangul fillers) are refused. Letters of different scripts that look alike (Latin and
Cyrillic "o") still make different names. Names starting with ``_`` or ``.`` are reserved
for the library.
"""

from __future__ import annotations

import re
import reprlib
import unicodedata

from pawn_queue.exceptions import ConfigError

MAX_NAME_LENGTH = 128
MAX_NAME_BYTES = 240  # one file name (255 bytes) with room for a suffix such as ".json"
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._\-]*")  # with fullmatch: "$" would allow "\n"
_BLANK_LETTERS = frozenset("\u115f\u1160\u3164\uffa0")  # Hangul fillers: letters that show nothing
_UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
RESERVED_PREFIXES = ("_", ".")


def validate_name(name: object, what: str = "name") -> str:
    """Return ``name`` if it is a valid topic, producer or consumer name, else raise ConfigError
    naming the first offending character (the rules are in the module docstring)."""
    if not isinstance(name, str):
        raise ConfigError(
            f"{what} must be a string, got {type(name).__name__} {reprlib.repr(name)}"
        )
    shown = repr(name if len(name) <= 40 else name[:40] + "...")
    if not name:
        raise ConfigError(f"{what} must not be empty")
    if len(name) > MAX_NAME_LENGTH:
        raise ConfigError(
            f"{what} {shown} is {len(name)} characters long; at most {MAX_NAME_LENGTH}"
        )
    if name.startswith(RESERVED_PREFIXES):
        raise ConfigError(f"{what} {shown} starts with '_' or '.', which are reserved")
    rules = (
        "use letters and digits of any script, '.', '_' and '-', starting with a letter or "
        "digit, without '..'"
    )
    if ".." in name:
        raise ConfigError(f"{what} {shown} is invalid: {rules}")
    if name.isascii():
        if not _NAME_RE.fullmatch(name):
            raise ConfigError(f"{what} {shown} is invalid: {rules}")
        return name
    for position, char in enumerate(name):
        if not _name_char_allowed(char, first=position == 0):
            label = unicodedata.name(char, f"U+{ord(char):04X}")
            raise ConfigError(
                f"{what} {shown} is invalid: character {char!r} ({label}) is not allowed; {rules}"
            )
    normal = unicodedata.normalize("NFKC", name)
    if normal != name:
        raise ConfigError(
            f"{what} {shown} is invalid: it has compatibility characters (fullwidth, ligature, "
            f"dot leader...) that look like {normal!r}"
        )
    if len(name.encode()) > MAX_NAME_BYTES:
        raise ConfigError(f"{what} {shown} is longer than {MAX_NAME_BYTES} bytes in UTF-8")
    return name


def _name_char_allowed(char: str, *, first: bool) -> bool:
    if char.isascii():
        return char.isalnum() or (not first and char in "._-")
    category = unicodedata.category(char)
    if category[0] in "LN":
        return char not in _BLANK_LETTERS
    if category in ("Mn", "Mc"):
        # A mark joins the character before it; overlay marks can draw a slash through it.
        return not first and "OVERLAY" not in unicodedata.name(char, "")
    return False


def is_uuid(value: str) -> bool:
    return bool(_UUID_RE.match(value))
