"""What every command module shares: the handler type, argparse helpers, opening the database.

Standard library only at import: ``tunefleet --help`` builds every command's parser.
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import TypeAlias

    from tunefleet.config import Settings
    from tunefleet.db import Database

    #: The ``tunefleet`` parser's subparsers, which each command module adds its commands to.
    Subparsers: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]

#: A command: its parsed arguments and the settings in, an exit status (None: 0) out.
Handler = Callable[[argparse.Namespace, "Settings"], int | None]

#: What adds one command (and its subcommands) to the subparsers.
AddParser = Callable[["Subparsers"], None]


def open_db(settings: Settings, *, check_schema: bool = True) -> Database:
    """The database of the settings, without seeding the hardware classes (unlike a context's).

    Parameters
    ----------
    settings : Settings
        The effective configuration.
    check_schema : bool, optional
        Refuse a database whose schema is not at the newest revision (default True); the
        ``db`` commands, which migrate it, pass False.

    Returns
    -------
    Database
    """
    from tunefleet.db import Database

    return Database.from_settings(settings, check_schema=check_schema)


_DURATION = re.compile(r"(?:(?P<d>\d+)d)?(?:(?P<h>\d+)h)?(?:(?P<m>\d+)m)?(?:(?P<s>\d+)s)?")


def duration(flag: str) -> Callable[[str], dt.timedelta]:
    """An argparse ``type``: a duration such as ``1d``, ``12h``, ``1d12h``, ``30m``, ``90s`` or
    ``0``; anything else is one :class:`~tunefleet.errors.ParameterError` line naming ``flag``."""
    from tunefleet.errors import ParameterError

    def parse(text: str) -> dt.timedelta:
        value = text.strip().lower()
        if value == "0":
            return dt.timedelta(0)
        match = _DURATION.fullmatch(value)
        if match is None or not any(match.groupdict().values()):
            raise ParameterError(f"invalid {flag}: {text!r} (give a duration such as 1d, 12h, 30m, 90s or 0)")
        d, h, m, s = (int(match[k] or 0) for k in ("d", "h", "m", "s"))
        return dt.timedelta(days=d, hours=h, minutes=m, seconds=s)

    return parse


def at_least(minimum: int, flag: str, *, at_most: int | None = None) -> Callable[[str], int]:
    """An argparse ``type``: an integer >= ``minimum`` (and <= ``at_most``, if given); anything else
    is one :class:`~tunefleet.errors.ParameterError` line naming ``flag``, before any work (flags
    that are :class:`~tunefleet.config.TuneKnobs` fields are checked by the options instead)."""
    from tunefleet.errors import ParameterError

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ParameterError(f"invalid {flag}: {text!r} (not an integer)") from None
        if value < minimum:
            raise ParameterError(f"invalid {flag}: {value} (must be >= {minimum})")
        if at_most is not None and value > at_most:
            raise ParameterError(f"invalid {flag}: {value} (must be <= {at_most})")
        return value

    return parse


def between(low: float, high: float, flag: str) -> Callable[[str], float]:
    """An argparse ``type``: a number strictly between ``low`` and ``high`` (so never ``inf`` or
    ``nan``); anything else is one :class:`~tunefleet.errors.ParameterError` line naming ``flag``."""
    from tunefleet.errors import ParameterError

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise ParameterError(f"invalid {flag}: {text!r} (not a number)") from None
        if not low < value < high:  # False for nan too
            raise ParameterError(f"invalid {flag}: {value:g} (must be between {low:g} and {high:g}, exclusive)")
        return value

    return parse


TCP_PORT = at_least(0, "--port", at_most=65535)
"""An argparse ``type``: a TCP port to listen on (0: any free one)."""


def listen_address(text: str) -> str:
    """An argparse ``type`` for ``--addr``: an address of this machine to listen on (an IP address
    or a host name that resolves to one), checked by binding it to a free port now, so that a
    typo or another host's address is one :class:`~tunefleet.errors.ParameterError` line and not a
    traceback once the server starts."""
    import socket

    from tunefleet.errors import ParameterError

    try:
        family, kind, proto, _, where = socket.getaddrinfo(text, 0, type=socket.SOCK_STREAM,
                                                           flags=socket.AI_PASSIVE)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.bind(where)
    except (OSError, UnicodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise ParameterError(f"invalid --addr: {text!r} (not an address of this machine to listen on: "
                             f"{reason})") from None
    return text


def zoo_options(p: argparse.ArgumentParser) -> None:
    """The zoo models' shape flags (``ingest`` and ``run``)."""
    p.add_argument("--batch-size", type=int, default=1, help="zoo models: batch size")
    p.add_argument("--image-size", type=int, default=None, help="zoo image models: height = width")
    p.add_argument("--seq-len", type=int, default=None, help="bert-base: sequence length")
