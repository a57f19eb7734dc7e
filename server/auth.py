"""Room tokens: JWTs (HS256 with the server secret), one room each, with an expiry and grants.

Owns issuing and checking the tokens that `chorus token ROOM` prints and every stream, phone leg,
event feed and REST call must present. A token is a standard JWT signed with HS256 and the server
secret, so a user's backend can mint one with any JWT library (as LiveKit access tokens are
minted). Claims:

- `room` (required): the one room the token opens;
- `exp`, `iat` (required, unix seconds);
- `sub` (optional): the participant; a stream that names another participant is refused;
- `grants` (optional, default `["stream", "feed", "chat"]`): what the bearer may do —
  `stream` (send audio: device streams and phone legs), `feed` (read the live feed and the
  transcript, rename speakers), `chat` (post messages), `admin` (delete the room).

Stateless on purpose: any server holding the secret can check a token, and nothing is stored.
The signature is checked before any claim is believed; checks happen before a byte of audio is
read. The home-made `v1.<payload>.<signature>` tokens of earlier versions are refused with a
message that says to mint a new one.
"""

from __future__ import annotations

import binascii
import enum
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import jwt
from jwt.utils import base64url_decode, base64url_encode

ALGORITHM = "HS256"
MIN_SECRET_BYTES = 16


class Grant(enum.StrEnum):
    STREAM = "stream"
    FEED = "feed"
    CHAT = "chat"
    ADMIN = "admin"


DEFAULT_GRANTS: tuple[Grant, ...] = (Grant.STREAM, Grant.FEED, Grant.CHAT)
"""What a token without a `grants` claim allows (everything but `admin`)."""


class TokenProblem(enum.Enum):
    MISSING = "missing"
    NOT_ASCII = "not_ascii"
    MALFORMED = "malformed"
    BAD_SIGNATURE = "bad_signature"
    EXPIRED = "expired"
    WRONG_ROOM = "wrong_room"
    NOT_GRANTED = "not_granted"
    WRONG_PARTICIPANT = "wrong_participant"


class TokenError(Exception):
    """A token that does not let its bearer in; `problem` says why."""

    def __init__(self, problem: TokenProblem, message: str) -> None:
        super().__init__(message)
        self.problem = problem


@dataclass(frozen=True)
class RoomGrant:
    """What a valid token grants: one room, until `expires_at` (unix seconds)."""

    room: str
    expires_at: int
    issued_at: int
    grants: frozenset[Grant] = frozenset(DEFAULT_GRANTS)
    participant: str | None = None

    def allows(self, grant: Grant) -> bool:
        return grant in self.grants


def generate_secret() -> str:
    """A fresh random secret (the loopback-only server makes one when none is configured)."""
    return secrets.token_urlsafe(32)


def check_secret(secret: str) -> None:
    if len(secret.encode()) < MIN_SECRET_BYTES:
        raise ValueError(f"the server secret must be at least {MIN_SECRET_BYTES} bytes long")


def parse_grants(names: Iterable[str]) -> frozenset[Grant]:
    """Grant names as given on a command line or in a claim; `ValueError` names an unknown one."""
    out: set[Grant] = set()
    for name in names:
        try:
            out.add(Grant(name))
        except ValueError:
            known = ", ".join(g.value for g in Grant)
            raise ValueError(f"unknown grant {name!r} (known: {known})") from None
    return frozenset(out)


def issue_token(
    secret: str,
    room: str,
    ttl_s: int = 3600,
    *,
    grants: Iterable[Grant | str] | None = None,
    participant: str | None = None,
    now: float | None = None,
) -> str:
    """A JWT for `room` valid for `ttl_s` seconds (default grants: stream, feed, chat)."""
    if not room:
        raise ValueError("a token needs a room")
    if ttl_s <= 0:
        raise ValueError("ttl must be positive")
    check_secret(secret)
    chosen = parse_grants(str(g) for g in (DEFAULT_GRANTS if grants is None else grants))
    if not chosen:
        raise ValueError("a token needs at least one grant")
    issued = int(time.time() if now is None else now)
    claims: dict[str, Any] = {
        "room": room,
        "iat": issued,
        "exp": issued + int(ttl_s),
        "grants": sorted(g.value for g in chosen),
    }
    if participant is not None:
        claims["sub"] = participant
    return jwt.encode(claims, secret, algorithm=ALGORITHM)


def _claims(secret: str, token: str) -> dict[str, Any]:
    """The verified claims of a token (signature first), or `TokenError`."""
    try:
        token.encode("ascii")
    except UnicodeEncodeError:
        raise TokenError(TokenProblem.NOT_ASCII, "token is not ASCII text") from None
    if token.startswith("v1.") and token.count(".") == 2:
        raise TokenError(
            TokenProblem.MALFORMED,
            "old-format chorus v1 token: mint a JWT with `chorus token ROOM`",
        )
    try:
        claims: dict[str, Any] = jwt.decode(
            token,
            secret,
            algorithms=[ALGORITHM],
            options={"require": ["room", "exp", "iat"], "verify_exp": False, "verify_iat": False},
        )
    except jwt.InvalidSignatureError:
        raise TokenError(TokenProblem.BAD_SIGNATURE, "token signature does not match") from None
    except jwt.MissingRequiredClaimError as exc:
        raise TokenError(TokenProblem.MALFORMED, f"token has no {exc.claim!r} claim") from None
    except jwt.InvalidAlgorithmError:
        raise TokenError(TokenProblem.MALFORMED, "token is not signed with HS256") from None
    except jwt.InvalidTokenError:
        raise TokenError(TokenProblem.MALFORMED, "token is not a readable JWT") from None
    signature = token.rsplit(".", 1)[-1]
    try:  # base64 has spellings that decode alike; only the canonical one is the signature
        canonical = base64url_encode(base64url_decode(signature)).decode("ascii") == signature
    except (binascii.Error, ValueError):
        canonical = False
    if not canonical:
        raise TokenError(TokenProblem.BAD_SIGNATURE, "token signature does not match")
    return claims


def verify_token(
    secret: str,
    token: str | None,
    room: str,
    *,
    need: Grant | None = None,
    now: float | None = None,
) -> RoomGrant:
    """The grant `token` carries for `room` (and `need`, if given), or `TokenError` saying what
    is wrong with it. The signature is checked before anything in the payload is believed."""
    if not token:
        raise TokenError(TokenProblem.MISSING, "no token given")
    claims = _claims(secret, token)
    try:
        raw_grants = claims.get("grants", [g.value for g in DEFAULT_GRANTS])
        if not isinstance(raw_grants, list) or not all(isinstance(g, str) for g in raw_grants):
            raise ValueError("grants must be a list of names")
        subject = claims.get("sub")
        if subject is not None and not isinstance(subject, str):
            raise ValueError("sub must be a string")
        if not isinstance(claims["room"], str):
            raise ValueError("room must be a string")
        grant = RoomGrant(
            room=claims["room"],
            expires_at=int(claims["exp"]),
            issued_at=int(claims["iat"]),
            grants=parse_grants(raw_grants),
            participant=subject,
        )
    except (ValueError, TypeError) as exc:
        raise TokenError(TokenProblem.MALFORMED, f"token claims unreadable: {exc}") from None
    current = time.time() if now is None else now
    if current >= grant.expires_at:
        raise TokenError(TokenProblem.EXPIRED, "token expired")
    if grant.room != room:
        raise TokenError(TokenProblem.WRONG_ROOM, "token is for another room")
    if need is not None and not grant.allows(need):
        raise TokenError(TokenProblem.NOT_GRANTED, f"token does not grant {need.value}")
    return grant
