"""Microsoft Teams through the Bot Framework: activities in, replies out (B1).

Teams posts a Bot Framework *activity* to the bot's messaging endpoint for each message in a
channel, group chat or personal chat the bot is in. The parser keeps what attribution needs and
nothing it cannot trust: the sender's display name `from.name` becomes `sender_name`; the
sender's stable id is `from.aadObjectId` (the Entra object id; `from.id` when absent); the
conversation is `conversation.id`, a group when `conversationType` is `channel` or `groupChat`
(or `isGroup`). Mentions of the bot (`<at>Bot</at>`, listed in `entities`) are stripped from the
text; mentions of people read as their name. `messageReaction` activities become reaction turns
(`(reaction: like)`, `metadata["reaction"]`). Other activity types are accepted and ignored.
The activity `id` is the dedupe key (Bot Framework retries a delivery that got no 2xx); an
activity without one is taken every time it comes.

Replies go through `BotFrameworkClient`: `POST {serviceUrl}/v3/conversations/{id}/activities`
with the bot's bearer token (a `TokenProvider`; Entra client-credentials in production).

Inbound authentication: Bot Framework signs each request with a JWT (`Authorization: Bearer`)
issued by `https://api.botframework.com` for the bot's app id, keys from the Bot Framework
OpenID metadata. `BotFrameworkTokenValidator` checks exactly that against a JWKS URL; it is
configuration (`teams.app_id`, `teams.jwks_url`): offline tests point it at a local key server.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal
from urllib.parse import quote

import httpx
import jwt
from pydantic import BaseModel, ConfigDict, Field

from server.ingress.base import (
    Conversation,
    InboundItem,
    Ingress,
    IngressError,
    WebhookAnswer,
    parse_body,
)

PROVIDER = "teams"
BOT_FRAMEWORK_ISSUER = "https://api.botframework.com"
BOT_FRAMEWORK_JWKS_URL = "https://login.botframework.com/v1/.well-known/keys"
BOT_FRAMEWORK_TOKEN_URL = "https://login.microsoftonline.com/botframework.com/oauth2/v2.0/token"
GROUP_CONVERSATION_TYPES = frozenset({"channel", "groupChat"})
TokenProvider = Callable[[], Awaitable[str]]


# --------------------------------------------------------------------------- the wire


class _Wire(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore")


class ChannelAccount(_Wire):
    id: str
    name: str | None = None
    aad_object_id: str | None = Field(default=None, alias="aadObjectId")


class ConversationAccount(_Wire):
    id: str
    conversation_type: str | None = Field(default=None, alias="conversationType")
    is_group: bool | None = Field(default=None, alias="isGroup")
    tenant_id: str | None = Field(default=None, alias="tenantId")
    name: str | None = None


class Entity(_Wire):
    type: str
    mentioned: ChannelAccount | None = None
    text: str | None = None


class MessageReaction(_Wire):
    type: str


class Activity(_Wire):
    """A Bot Framework activity, the fields Chorus reads."""

    type: str
    id: str | None = None
    timestamp: str | None = None
    service_url: str | None = Field(default=None, alias="serviceUrl")
    channel_id: str | None = Field(default=None, alias="channelId")
    from_: ChannelAccount = Field(alias="from")
    conversation: ConversationAccount
    recipient: ChannelAccount | None = None
    text: str | None = None
    entities: list[Entity] = Field(default_factory=list)
    reply_to_id: str | None = Field(default=None, alias="replyToId")
    reactions_added: list[MessageReaction] = Field(default_factory=list, alias="reactionsAdded")
    reactions_removed: list[MessageReaction] = Field(default_factory=list, alias="reactionsRemoved")


class OutgoingActivity(_Wire):
    """What `BotFrameworkClient` posts to `/v3/conversations/{id}/activities`."""

    type: Literal["message"] = "message"
    text: str
    text_format: Literal["plain", "markdown"] = Field(default="plain", alias="textFormat")
    reply_to_id: str | None = Field(default=None, alias="replyToId")


class ResourceResponse(_Wire):
    id: str = ""


# --------------------------------------------------------------------------- parsing

_AT_TAG = re.compile(r"<at>(.*?)</at>", re.DOTALL)
_SPACES = re.compile(r"[ \t]+")


def parse_activity(body: bytes | str) -> Activity:
    """The activity in a webhook body; `IngressError(400)` when it is not one."""
    return parse_body(Activity, body, "a Bot Framework activity")


def _strip_mentions(activity: Activity) -> str:
    text = activity.text or ""
    bot_id = activity.recipient.id if activity.recipient is not None else None
    for entity in activity.entities:
        if entity.type != "mention" or entity.mentioned is None or not entity.text:
            continue
        if entity.mentioned.id == bot_id:
            text = text.replace(entity.text, " ")
    text = _AT_TAG.sub(lambda m: m.group(1), text)  # people mentioned read as their name
    lines = [_SPACES.sub(" ", line).strip() for line in text.splitlines()]
    return "\n".join(line for line in lines if line)


def _conversation(activity: Activity) -> Conversation:
    conv = activity.conversation
    group = conv.conversation_type in GROUP_CONVERSATION_TYPES or bool(conv.is_group)
    reply_to = {"service_url": activity.service_url or ""}
    if activity.id:
        reply_to["activity_id"] = activity.id
    return Conversation(PROVIDER, conv.id, group, reply_to)


def activity_items(activity: Activity) -> list[InboundItem]:
    """B1: the turns of one activity (none for activity types Chorus does not take)."""
    sender = activity.from_
    sender_id = sender.aad_object_id or sender.id
    metadata: dict[str, Any] = {
        "teams_conversation_id": activity.conversation.id,
        "teams_activity_id": activity.id,
    }
    if activity.conversation.tenant_id:
        metadata["teams_tenant_id"] = activity.conversation.tenant_id
    conversation = _conversation(activity)
    if activity.type == "message":
        text = _strip_mentions(activity)
        if not text:
            return []
        return [InboundItem(conversation, sender_id, sender.name, text, metadata, activity.id)]
    if activity.type == "messageReaction":
        items = []
        for n, (reaction, verb) in enumerate(
            (
                *((r, "reaction") for r in activity.reactions_added),
                *((r, "reaction removed") for r in activity.reactions_removed),
            )
        ):
            meta = {**metadata, "reaction": reaction.type, "reaction_to": activity.reply_to_id}
            if verb != "reaction":
                meta["reaction_removed"] = True
            items.append(
                InboundItem(
                    conversation,
                    sender_id,
                    sender.name,
                    f"({verb}: {reaction.type})",
                    meta,
                    None if activity.id is None else f"{activity.id}#{n}",  # one activity, n turns
                )
            )
        return items
    return []


# --------------------------------------------------------------------------- inbound auth


class BotFrameworkTokenValidator:
    """Checks the `Authorization: Bearer` JWT Bot Framework sends with every activity.

    Signature (RS256, key from `jwks_url` by its `kid`), issuer, audience (the bot's app id),
    expiry, and that the token has a `serviceUrl` claim equal to the activity's (replies carry the
    bot's connector token to that URL).
    """

    def __init__(
        self,
        app_id: str,
        *,
        jwks_url: str = BOT_FRAMEWORK_JWKS_URL,
        issuer: str = BOT_FRAMEWORK_ISSUER,
        leeway_s: float = 300.0,
    ) -> None:
        self.app_id = app_id
        self.issuer = issuer
        self.leeway_s = leeway_s
        self._keys = jwt.PyJWKClient(jwks_url, cache_keys=True, lifespan=3600)

    async def validate(self, headers: Mapping[str, str], activity: Activity) -> None:
        auth = next((v for k, v in headers.items() if k.lower() == "authorization"), "")
        if not auth.lower().startswith("bearer "):
            raise IngressError(401, "missing Bot Framework bearer token")
        token = auth[7:].strip()
        try:
            key = await asyncio.to_thread(self._keys.get_signing_key_from_jwt, token)
            claims = jwt.decode(
                token,
                key.key,
                algorithms=["RS256"],
                audience=self.app_id,
                issuer=self.issuer,
                leeway=self.leeway_s,
                options={"require": ["exp", "iss", "aud"]},
            )
        except (jwt.PyJWTError, jwt.PyJWKClientError) as exc:
            raise IngressError(401, f"Bot Framework token rejected: {exc}") from exc
        # the bot's connector token is later sent to the activity's serviceUrl: only a token that
        # names that very URL may bring it (a token without the claim is refused, as botbuilder does)
        service_url = claims.get("serviceurl") or claims.get("serviceUrl")
        if not service_url:
            raise IngressError(401, "Bot Framework token has no serviceUrl claim")
        if service_url != activity.service_url:
            raise IngressError(401, "token serviceUrl does not match the activity")


# --------------------------------------------------------------------------- replies


class BotFrameworkCredentials:
    """A `TokenProvider`: the bot's connector token by the OAuth client-credentials grant
    (`client_id` = app id, `client_secret` = app password, scope `https://api.botframework.com/
    .default`), cached until a minute before it expires."""

    def __init__(
        self,
        app_id: str,
        app_password: str,
        *,
        token_url: str = BOT_FRAMEWORK_TOKEN_URL,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self.app_id = app_id
        self.app_password = app_password
        self.token_url = token_url
        self.http = http or httpx.AsyncClient(timeout=10.0)
        self._token: str | None = None
        self._expires_at = 0.0
        self._lock = asyncio.Lock()

    async def __call__(self) -> str:
        async with self._lock:
            loop = asyncio.get_running_loop()
            if self._token is None or loop.time() >= self._expires_at:
                response = await self.http.post(
                    self.token_url,
                    data={
                        "grant_type": "client_credentials",
                        "client_id": self.app_id,
                        "client_secret": self.app_password,
                        "scope": "https://api.botframework.com/.default",
                    },
                )
                response.raise_for_status()
                granted = TokenResponse.model_validate_json(response.content)
                self._token = granted.access_token
                self._expires_at = loop.time() + max(0, granted.expires_in - 60)
            return self._token

    async def close(self) -> None:
        await self.http.aclose()


class TokenResponse(_Wire):
    """The OAuth token endpoint's answer."""

    token_type: str = "Bearer"
    expires_in: int = 3600
    access_token: str


class BotFrameworkClient:
    """`ReplyClient` for Teams: posts a message activity to the conversation's service URL."""

    def __init__(
        self,
        token: TokenProvider | None = None,
        *,
        http: httpx.AsyncClient | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        self.token = token
        self.http = http or httpx.AsyncClient(timeout=timeout_s)

    async def send_text(self, conversation: Conversation, text: str) -> None:
        service_url = conversation.reply_to.get("service_url")
        if not service_url:
            raise ValueError(f"conversation {conversation.conversation_id!r} has no serviceUrl")
        url = (
            f"{service_url.rstrip('/')}/v3/conversations/"
            f"{quote(conversation.conversation_id, safe='')}/activities"
        )
        headers = {"Content-Type": "application/json"}
        if self.token is not None:
            headers["Authorization"] = f"Bearer {await self.token()}"
        activity = OutgoingActivity(text=text)
        response = await self.http.post(
            url,
            content=activity.model_dump_json(by_alias=True, exclude_none=True),
            headers=headers,
        )
        response.raise_for_status()

    async def close(self) -> None:
        await self.http.aclose()


# --------------------------------------------------------------------------- the endpoint


class TeamsWebhook:
    """`POST /v1/webhooks/teams`: authenticate, parse, commit; refusals change nothing.

    `validator` is the Bot Framework token check; `None` accepts unauthenticated activities and
    is only for a deployment whose gateway already validated the token (say so explicitly with
    `trust_gateway=True`).
    """

    def __init__(
        self,
        ingress: Ingress,
        validator: BotFrameworkTokenValidator | None,
        *,
        trust_gateway: bool = False,
    ) -> None:
        if validator is None and not trust_gateway:
            raise ValueError("Teams needs a token validator (or trust_gateway=True behind a gateway)")
        self.ingress = ingress
        self.validator = validator

    async def handle(self, headers: Mapping[str, str], body: bytes) -> WebhookAnswer:
        try:
            if self.validator is not None and not any(
                k.lower() == "authorization" for k in headers
            ):
                raise IngressError(401, "missing Bot Framework bearer token")
            activity = parse_activity(body)
            if self.validator is not None:
                await self.validator.validate(headers, activity)
            items = activity_items(activity)
        except IngressError as exc:
            return WebhookAnswer(exc.status, {"error": exc.message})
        accepted = await self.ingress.accept(items)
        return WebhookAnswer(
            200, {"accepted": len(accepted.events)}, tuple(accepted.events), accepted.duplicates
        )
