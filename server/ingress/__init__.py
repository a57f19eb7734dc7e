"""Chat ingress for `chorus serve`: Microsoft Teams and WhatsApp conversations as rooms (B1).

Owns parsing each provider's webhook into turns that carry `metadata["sender_name"]`, checking
the provider's request signature, binding each conversation to a room (a group chat as a group
binding) and sending agents' replies back through the provider's API (`ReplyClient`, which tests
replace with a local server speaking the same API). The HTTP routes only call
`TeamsWebhook.handle` / `WhatsAppWebhook.handle` with the headers and the raw body.
"""

from server.ingress.base import (
    Accepted,
    Conversation,
    ConversationChannel,
    InboundItem,
    Ingress,
    IngressError,
    ReplyClient,
    WebhookAnswer,
)
from server.ingress.teams import BotFrameworkClient, BotFrameworkTokenValidator, TeamsWebhook
from server.ingress.whatsapp import CloudApiClient, WhatsAppWebhook

__all__ = [
    "Accepted",
    "BotFrameworkClient",
    "BotFrameworkTokenValidator",
    "CloudApiClient",
    "Conversation",
    "ConversationChannel",
    "InboundItem",
    "Ingress",
    "IngressError",
    "ReplyClient",
    "TeamsWebhook",
    "WebhookAnswer",
    "WhatsAppWebhook",
]
