"""The webhooks `chorus serve` runs, built from its `[teams]` and `[whatsapp]` sections.

Owns turning configuration into `TeamsWebhook` / `WhatsAppWebhook` objects over the server's
kit (each conversation's room opened through the server's live rooms, so the room gets the
pipeline's channels — the realtime session, the chat model — like any other) and closing their
HTTP clients at shutdown.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from rooms import RoomKit
from server.config import ServerConfig
from server.ingress.base import Ingress
from server.ingress.teams import (
    BotFrameworkClient,
    BotFrameworkCredentials,
    BotFrameworkTokenValidator,
    TeamsWebhook,
)
from server.ingress.whatsapp import CloudApiClient, WhatsAppWebhook


@dataclass
class Webhooks:
    teams: TeamsWebhook | None = None
    whatsapp: WhatsAppWebhook | None = None
    _closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

    async def close(self) -> None:
        for close in self._closers:
            await close()


def build_webhooks(
    config: ServerConfig, kit: RoomKit, open_room: Callable[[str], Awaitable[None]]
) -> Webhooks:
    hooks = Webhooks()
    teams = config.teams
    if teams.enabled:
        credentials = None
        if teams.app_id and teams.app_password:
            credentials = BotFrameworkCredentials(
                teams.app_id, teams.app_password, token_url=teams.token_url
            )
            hooks._closers.append(credentials.close)
        client = BotFrameworkClient(credentials)
        ingress = Ingress(kit, "teams", client, open_room=open_room)
        validator = None
        if not teams.trust_gateway:
            assert teams.app_id is not None  # TeamsConfig checks it
            validator = BotFrameworkTokenValidator(
                teams.app_id, jwks_url=teams.jwks_url, issuer=teams.issuer
            )
        hooks.teams = TeamsWebhook(ingress, validator, trust_gateway=teams.trust_gateway)
        hooks._closers += [ingress.close, client.close]
    whatsapp = config.whatsapp
    if whatsapp.enabled:
        assert whatsapp.app_secret is not None  # WhatsAppConfig checks it
        cloud = CloudApiClient(whatsapp.access_token, graph_url=whatsapp.graph_url)
        ingress = Ingress(kit, "whatsapp", cloud, open_room=open_room)
        hooks.whatsapp = WhatsAppWebhook(ingress, whatsapp.app_secret, whatsapp.verify_token)
        hooks._closers += [ingress.close, cloud.close]
    return hooks
