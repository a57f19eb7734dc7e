"""Room tokens: HMAC-signed, one room each, with an expiry.

Owns issuing and checking the tokens that `chorus token ROOM` prints and every stream, phone leg
and event feed must present. A token is `v1.<payload>.<signature>` (base64url, no padding) where
the payload is `{"room": ..., "exp": ..., "iat": ...}` and the signature is HMAC-SHA256 over
`v1.<payload>` with the server secret. Stateless on purpose: any server holding the secret can
check a token, and nothing is stored. A token names exactly one room, so it can neither read nor
write another; checks happen before a single byte of audio is read.
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass

VERSION = "v1"
MIN_SECRET_BYTES = 16


class TokenProblem(enum.Enum):
    MISSING = "missing"
    MALFORMED = "malformed"
    BAD_SIGNATURE = "bad_signature"
    EXPIRED = "expired"
    WRONG_ROOM = "wrong_room"


class TokenError(Exception):
    """A token that does not let its bearer into the room; `problem` says why."""

    def __init__(self, problem: TokenProblem, message: str) -> None:
        super().__init__(message)
        self.problem = problem


@dataclass(frozen=True)
class RoomGrant:
    """What a valid token grants: one room, until `expires_at` (unix seconds)."""

    room: str
    expires_at: int
    issued_at: int


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _sign(secret: str, message: str) -> str:
    return _b64(hmac.new(secret.encode(), message.encode("ascii"), hashlib.sha256).digest())


def generate_secret() -> str:
    """A fresh random secret (the loopback-only server makes one when none is configured)."""
    return secrets.token_urlsafe(32)


def check_secret(secret: str) -> None:
    if len(secret.encode()) < MIN_SECRET_BYTES:
        raise ValueError(f"the server secret must be at least {MIN_SECRET_BYTES} bytes long")


def issue_token(secret: str, room: str, ttl_s: int = 3600, *, now: float | None = None) -> str:
    """A token for `room` valid for `ttl_s` seconds."""
    if not room:
        raise ValueError("a token needs a room")
    if ttl_s <= 0:
        raise ValueError("ttl must be positive")
    check_secret(secret)
    issued = int(time.time() if now is None else now)
    payload = json.dumps(
        {"room": room, "iat": issued, "exp": issued + int(ttl_s)}, separators=(",", ":")
    )
    body = f"{VERSION}.{_b64(payload.encode())}"
    return f"{body}.{_sign(secret, body)}"


def verify_token(
    secret: str, token: str | None, room: str, *, now: float | None = None
) -> RoomGrant:
    """The grant `token` carries for `room`, or `TokenError` saying what is wrong with it.

    The signature is checked before anything in the payload is believed, and compared in
    constant time.
    """
    if not token:
        raise TokenError(TokenProblem.MISSING, "no token given")
    parts = token.split(".")
    if len(parts) != 3 or parts[0] != VERSION:
        raise TokenError(TokenProblem.MALFORMED, "token is not a chorus v1 token")
    body = f"{parts[0]}.{parts[1]}"
    if not hmac.compare_digest(_sign(secret, body), parts[2]):
        raise TokenError(TokenProblem.BAD_SIGNATURE, "token signature does not match")
    try:
        claims = json.loads(_unb64(parts[1]))
        grant = RoomGrant(
            room=str(claims["room"]), expires_at=int(claims["exp"]), issued_at=int(claims["iat"])
        )
    except (ValueError, KeyError, TypeError, binascii.Error) as exc:
        raise TokenError(TokenProblem.MALFORMED, "token payload unreadable") from exc
    current = time.time() if now is None else now
    if current >= grant.expires_at:
        raise TokenError(TokenProblem.EXPIRED, "token expired")
    if not hmac.compare_digest(grant.room.encode(), room.encode()):
        raise TokenError(TokenProblem.WRONG_ROOM, "token is for another room")
    return grant
