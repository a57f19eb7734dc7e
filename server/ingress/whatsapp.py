"""WhatsApp through the Cloud API: webhooks in, replies out (B1).

Meta posts a webhook for every message to the business number: `entry[].changes[].value` holds
`contacts[]` (`profile.name`, `wa_id`) and `messages[]` (`from`, `id`, `type`, `text.body`; a
message sent in a group carries `group_id`). The sender's profile name becomes `sender_name`;
the sender's id is their WhatsApp id (`from`), which never reaches a model (a turn without a
name reads as its channel, C4). A group is one conversation (a group binding); a one-to-one chat
is the conversation of the business number with that person. Reactions become reaction turns
(`(reaction: 👍)`); status callbacks (sent/delivered/read) are accepted and ignored. Each message's
`id` (the wamid) is its dedupe key: Meta retries a webhook until it gets a 200.

Every call is signed: `X-Hub-Signature-256: sha256=<HMAC-SHA256 of the raw body with the app
secret>`. The signature is checked over the raw bytes before anything is parsed; a missing or
wrong one is refused with 401 and changes nothing.

Replies go through `CloudApiClient`: `POST {graph_url}/{phone_number_id}/messages` with the
access token, to the person (`recipient_type: individual`) or the group.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field

from server.ingress.base import (
    Conversation,
    InboundItem,
    Ingress,
    IngressError,
    WebhookAnswer,
    parse_body,
)

PROVIDER = "whatsapp"
SIGNATURE_HEADER = "X-Hub-Signature-256"
GRAPH_URL = "https://graph.facebook.com/v21.0"


# --------------------------------------------------------------------------- the wire


class _Wire(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore")


class Profile(_Wire):
    name: str | None = None


class Contact(_Wire):
    wa_id: str
    profile: Profile | None = None


class TextBody(_Wire):
    body: str


class Reaction(_Wire):
    message_id: str | None = None
    emoji: str | None = None


class Media(_Wire):
    caption: str | None = None


class Message(_Wire):
    from_: str = Field(alias="from")
    id: str
    timestamp: str | None = None
    type: str
    text: TextBody | None = None
    reaction: Reaction | None = None
    image: Media | None = None
    video: Media | None = None
    document: Media | None = None
    group_id: str | None = None


class ValueMetadata(_Wire):
    display_phone_number: str | None = None
    phone_number_id: str


class ChangeValue(_Wire):
    messaging_product: str | None = None
    metadata: ValueMetadata | None = None
    contacts: list[Contact] = Field(default_factory=list)
    messages: list[Message] = Field(default_factory=list)
    statuses: list[dict[str, Any]] = Field(default_factory=list)


class Change(_Wire):
    field: str
    value: ChangeValue


class Entry(_Wire):
    id: str
    changes: list[Change] = Field(default_factory=list)


class Webhook(_Wire):
    object: Literal["whatsapp_business_account"]
    entry: list[Entry]


class OutgoingText(_Wire):
    """What `CloudApiClient` posts to `/{phone_number_id}/messages`."""

    messaging_product: Literal["whatsapp"] = "whatsapp"
    recipient_type: Literal["individual", "group"] = "individual"
    to: str
    type: Literal["text"] = "text"
    text: TextBody


class SendResult(_Wire):
    messaging_product: str = "whatsapp"
    messages: list[dict[str, Any]] = Field(default_factory=list)


# --------------------------------------------------------------------------- signature


def signature_of(app_secret: str, body: bytes) -> str:
    """The `X-Hub-Signature-256` value Meta sends for `body`."""
    return "sha256=" + hmac.new(app_secret.encode(), body, hashlib.sha256).hexdigest()


def verify_signature(app_secret: str, headers: Mapping[str, str], body: bytes) -> None:
    """`IngressError(401)` unless the request carries the right HMAC of its raw body."""
    given = next((v for k, v in headers.items() if k.lower() == SIGNATURE_HEADER.lower()), None)
    if not given:
        raise IngressError(401, f"missing {SIGNATURE_HEADER}")
    if not hmac.compare_digest(given.strip().encode(), signature_of(app_secret, body).encode()):
        raise IngressError(401, f"{SIGNATURE_HEADER} does not match the body")


def verify_subscription(query: Mapping[str, str], verify_token: str) -> str:
    """The webhook subscription handshake (`GET` with `hub.mode=subscribe`): the challenge to
    echo, or `IngressError(403)` when the verify token is wrong."""
    if query.get("hub.mode") != "subscribe" or not hmac.compare_digest(
        query.get("hub.verify_token", "").encode(), verify_token.encode()
    ):
        raise IngressError(403, "subscription verification failed")
    return query.get("hub.challenge", "")


# --------------------------------------------------------------------------- parsing


def parse_webhook(body: bytes | str) -> Webhook:
    """The webhook in a body; `IngressError(400)` when it is not one."""
    return parse_body(Webhook, body, "a WhatsApp webhook")


def _text_of(message: Message) -> str | None:
    if message.type == "text" and message.text is not None:
        return message.text.body
    if message.type == "reaction" and message.reaction is not None:
        if not message.reaction.emoji:
            return "(reaction removed)"
        return f"(reaction: {message.reaction.emoji})"
    media = {"image": message.image, "video": message.video, "document": message.document}
    if message.type in media:
        part = media[message.type]
        caption = part.caption if part is not None else None
        return f"({message.type}) {caption}" if caption else f"({message.type})"
    return None


def webhook_items(webhook: Webhook) -> list[InboundItem]:
    """B1: every message of the webhook, in order, with its sender's profile name."""
    items: list[InboundItem] = []
    for entry in webhook.entry:
        for change in entry.changes:
            value = change.value
            if change.field != "messages" or value.metadata is None:
                continue
            phone_number_id = value.metadata.phone_number_id
            names = {c.wa_id: c.profile.name for c in value.contacts if c.profile is not None}
            for message in value.messages:
                text = _text_of(message)
                if text is None or not text.strip():
                    continue
                group = message.group_id is not None
                peer = message.group_id if message.group_id is not None else message.from_
                conversation = Conversation(
                    PROVIDER,
                    f"{phone_number_id}:{'group' if group else 'user'}:{peer}",
                    group,
                    {"phone_number_id": phone_number_id, "to": peer},
                )
                metadata: dict[str, Any] = {
                    "whatsapp_message_id": message.id,
                    "whatsapp_type": message.type,
                }
                if message.reaction is not None:
                    metadata["reaction"] = message.reaction.emoji
                    metadata["reaction_to"] = message.reaction.message_id
                items.append(
                    InboundItem(
                        conversation,
                        message.from_,
                        names.get(message.from_),
                        text,
                        metadata,
                        message_id=message.id,  # a reaction has its own id, like any message
                    )
                )
    return items


# --------------------------------------------------------------------------- replies


class CloudApiClient:
    """`ReplyClient` for WhatsApp: a text message from the business number to the conversation."""

    def __init__(
        self,
        access_token: str | None,
        *,
        graph_url: str = GRAPH_URL,
        http: httpx.AsyncClient | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        self.access_token = access_token
        self.graph_url = graph_url.rstrip("/")
        self.http = http or httpx.AsyncClient(timeout=timeout_s)

    async def send_text(self, conversation: Conversation, text: str) -> None:
        phone_number_id = conversation.reply_to["phone_number_id"]
        message = OutgoingText(
            recipient_type="group" if conversation.group else "individual",
            to=conversation.reply_to["to"],
            text=TextBody(body=text),
        )
        headers = {"Content-Type": "application/json"}
        if self.access_token:
            headers["Authorization"] = f"Bearer {self.access_token}"
        response = await self.http.post(
            f"{self.graph_url}/{phone_number_id}/messages",
            content=message.model_dump_json(),
            headers=headers,
        )
        response.raise_for_status()

    async def close(self) -> None:
        await self.http.aclose()


# --------------------------------------------------------------------------- the endpoint


class WhatsAppWebhook:
    """`POST /v1/webhooks/whatsapp` (signature, parse, commit) and the `GET` handshake."""

    def __init__(self, ingress: Ingress, app_secret: str, verify_token: str | None = None) -> None:
        if not app_secret:
            raise ValueError("WhatsApp webhooks need the app secret to check signatures")
        self.ingress = ingress
        self.app_secret = app_secret
        self.verify_token = verify_token

    async def handle(self, headers: Mapping[str, str], body: bytes) -> WebhookAnswer:
        try:
            verify_signature(self.app_secret, headers, body)
            items = webhook_items(parse_webhook(body))
        except IngressError as exc:
            return WebhookAnswer(exc.status, {"error": exc.message})
        accepted = await self.ingress.accept(items)
        return WebhookAnswer(
            200, {"accepted": len(accepted.events)}, tuple(accepted.events), accepted.duplicates
        )

    def handshake(self, query: Mapping[str, str]) -> tuple[int, str]:
        """`GET /v1/webhooks/whatsapp`: (status, text to answer)."""
        if self.verify_token is None:
            return 404, "no verify token configured"
        try:
            return 200, verify_subscription(query, self.verify_token)
        except IngressError as exc:
            return exc.status, exc.message
