"""A local HTTP server speaking the providers' APIs, for tests and offline demos.

`LocalProviderServer` answers the Bot Framework connector route
(`POST /v3/conversations/{id}/activities`), the OAuth client-credentials token route
(`POST /oauth2/token`), the WhatsApp Cloud API route
(`POST /graph/{phone_number_id}/messages`) and serves a JWKS (`GET /keys`) so the Bot Framework
token check runs against real RS256 signatures. It parses requests with the same pydantic models
the clients send (`OutgoingActivity`, `OutgoingText`), so it cannot drift from them, and records
what it received. It runs uvicorn in-process on a free port without touching signal handlers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

import jwt
import uvicorn
from cryptography.hazmat.primitives.asymmetric import rsa
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from server.ingress.teams import (
    BOT_FRAMEWORK_ISSUER,
    OutgoingActivity,
    ResourceResponse,
    TokenResponse,
)
from server.ingress.whatsapp import OutgoingText, SendResult


@dataclass(frozen=True)
class Received:
    """One request the provider server took: its route, path parameter, auth and body."""

    api: str
    target: str
    authorization: str | None
    body: dict[str, Any]


class _QuietServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class LocalProviderServer:
    """`async with LocalProviderServer() as provider:` — `provider.url`, `provider.received`."""

    def __init__(self, *, fail_with: int | None = None) -> None:
        self.received: list[Received] = []
        self.token_requests: list[dict[str, str]] = []
        self.fail_with = fail_with
        self._key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self._kid = uuid.uuid4().hex[:8]
        self._server: _QuietServer | None = None
        self._task: asyncio.Task[None] | None = None
        self.url = ""
        self.app = self._build()

    def _build(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v3/conversations/{conversation_id}/activities")
        async def activities(conversation_id: str, request: Request) -> JSONResponse:
            activity = OutgoingActivity.model_validate_json(await request.body())
            return self._record(
                "botframework",
                conversation_id,
                request,
                activity.model_dump(by_alias=True, exclude_none=True),
                ResourceResponse(id=uuid.uuid4().hex).model_dump(),
            )

        @app.post("/graph/{phone_number_id}/messages")
        async def messages(phone_number_id: str, request: Request) -> JSONResponse:
            message = OutgoingText.model_validate_json(await request.body())
            result = SendResult(messages=[{"id": f"wamid.{uuid.uuid4().hex}"}])
            return self._record(
                "whatsapp", phone_number_id, request, message.model_dump(), result.model_dump()
            )

        @app.post("/oauth2/token")
        async def oauth_token(request: Request) -> JSONResponse:
            form = parse_qs((await request.body()).decode())
            self.token_requests.append({k: v[0] for k, v in form.items()})
            return JSONResponse(
                TokenResponse(access_token=f"connector-token-{len(self.token_requests)}").model_dump()
            )

        @app.get("/keys")
        async def keys() -> JSONResponse:
            jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self._key.public_key()))
            jwk.update({"kid": self._kid, "use": "sig", "alg": "RS256"})
            return JSONResponse({"keys": [jwk]})

        return app

    def _record(
        self, api: str, target: str, request: Request, body: dict[str, Any], answer: dict[str, Any]
    ) -> JSONResponse:
        self.received.append(Received(api, target, request.headers.get("authorization"), body))
        if self.fail_with is not None:
            return JSONResponse({"error": {"message": "refused by the test"}}, self.fail_with)
        return JSONResponse(answer)

    def bot_token(
        self,
        app_id: str,
        *,
        issuer: str = BOT_FRAMEWORK_ISSUER,
        service_url: str | None = None,
        expires_in: float = 3600,
        sign_with: rsa.RSAPrivateKey | None = None,
    ) -> str:
        """A Bot Framework-style JWT signed with this server's key (or `sign_with`)."""
        now = int(time.time())
        claims: dict[str, Any] = {"iss": issuer, "aud": app_id, "nbf": now - 5, "exp": now + int(expires_in)}
        if service_url is not None:
            claims["serviceurl"] = service_url
        return jwt.encode(
            claims, sign_with or self._key, algorithm="RS256", headers={"kid": self._kid}
        )

    async def __aenter__(self) -> LocalProviderServer:
        # no log_config, no log_level: uvicorn would otherwise reset the process's uvicorn loggers
        config = uvicorn.Config(
            self.app, host="127.0.0.1", port=0, log_config=None, access_log=False, lifespan="off"
        )
        self._server = _QuietServer(config)
        self._task = asyncio.create_task(self._server.serve())
        while not self._server.started:
            if self._task.done():
                await self._task
                raise RuntimeError("local provider server did not start")
            await asyncio.sleep(0.01)
        port = self._server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._task is not None:
            await self._task
