"""The schedule registry's bearer tokens (:class:`~tunefleet.db.tables.ApiToken`).

A token is ``tf_`` and 43 URL-safe random characters (256 bits), shown once when it is created;
the database keeps only its SHA-256, so a stolen database dump holds no usable token (a salted
slow hash buys nothing for a random 256-bit secret). ``write`` includes ``read``.
"""

from __future__ import annotations

import datetime as dt
import secrets

from sqlalchemy import select, update

from tunefleet.db._base import DatabaseBase, sha256_text
from tunefleet.db.tables import ApiToken, utcnow
from tunefleet.errors import NotFoundError, ParameterError

#: The scopes a token can have, weakest first: a scope grants itself and those before it.
SCOPES = ("read", "write")
TOKEN_PREFIX = "tf_"


#: What the database keeps of a token.
token_digest = sha256_text


def token_state(row: ApiToken, now: dt.datetime) -> str:
    """``live``, ``expired`` or ``revoked``."""
    if row.revoked_at is not None:
        return "revoked"
    return "expired" if row.expires_at is not None and row.expires_at <= now else "live"


def grants(scope: str, needed: str) -> bool:
    """Whether a token of ``scope`` may do what ``needed`` names."""
    return SCOPES.index(scope) >= SCOPES.index(needed)


class TokensMixin(DatabaseBase):
    """Create, check, list and revoke the registry's tokens."""

    def create_token(self, team: str, scope: str, *, expires_at: dt.datetime | None = None,
                     note: str = "") -> tuple[str, ApiToken]:
        """A new token for ``team``: (the token itself, shown only now; its row)."""
        team = team.strip()
        if not team:
            raise ParameterError("invalid team: empty")
        if scope not in SCOPES:
            raise ParameterError(f"invalid scope: {scope!r} (one of {', '.join(SCOPES)})")
        if expires_at is not None and expires_at <= utcnow():
            raise ParameterError(f"invalid expiry: {expires_at:%Y-%m-%d %H:%M} UTC is in the past")
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        row = ApiToken(team=team, scope=scope, token_sha256=token_digest(token), note=note, expires_at=expires_at)
        with self.session() as s:
            s.add(row)
            s.flush()
        return token, row

    def authenticate(self, token: str) -> ApiToken | None:
        """The live token row (not revoked, not expired) of ``token``, its use recorded; None
        for anything else (unknown, revoked, expired: the caller answers 401 alike)."""
        if not token.startswith(TOKEN_PREFIX):
            return None
        now = utcnow()
        with self.session() as s:
            row = s.scalars(select(ApiToken).where(ApiToken.token_sha256 == token_digest(token))).one_or_none()
            if row is None or token_state(row, now) != "live":
                return None
            row.last_used_at = now
            return row

    def api_tokens(self) -> list[ApiToken]:
        """Every token, revoked and expired ones included, oldest first."""
        with self.session() as s:
            return list(s.scalars(select(ApiToken).order_by(ApiToken.id)))

    def revoke_token(self, token_id: int) -> ApiToken:
        """Revoke a token now (once: revoking it again keeps the first time)."""
        with self.session() as s:
            row = s.get(ApiToken, token_id)
            if row is None:
                raise NotFoundError(f"unknown token id {token_id}")
            s.execute(update(ApiToken).where(ApiToken.id == token_id, ApiToken.revoked_at.is_(None))
                      .values(revoked_at=utcnow()))
            s.flush()
            s.refresh(row)
            return row
