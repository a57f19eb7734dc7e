"""A local Chat Completions server that takes as long as it is told: the slow chat model of
`chorus bench load --chat-delay SECONDS` (issue 24.1).

Real chat models take 1–5 s per answer. The load bench points the server's `[chat]` section at
this stand-in, so the voice latency with and without a slow model is measured in one run on the
same machine. It answers `POST /v1/chat/completions` with the SDK's own `ChatCompletion` value
(what the `openai` client parses), `delay` seconds after the request arrived, each request on its
own thread (a slow model answers concurrent rooms concurrently). It runs in its own process, so
its CPU is not the server's.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


def chat_completion(model: str, content: str, number: int) -> dict[str, Any]:
    """The body of one answer as the `openai` SDK's own `ChatCompletion` serialises it (the
    stand-ins of the bench and the tests answer with it)."""
    from openai.types.chat import ChatCompletion
    from openai.types.chat.chat_completion import Choice
    from openai.types.chat.chat_completion_message import ChatCompletionMessage

    completion = ChatCompletion(
        id=f"chatcmpl-{number}",
        object="chat.completion",
        created=int(time.time()),
        model=model,
        choices=[
            Choice(
                index=0,
                finish_reason="stop",
                message=ChatCompletionMessage(role="assistant", content=content),
            )
        ],
    )
    return completion.model_dump(mode="json", exclude_none=True)


class SlowChatServer:
    """`SlowChatServer(delay)`: `start()`, `base_url`, `requests` (how many were answered)."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.requests = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                if self.path != "/v1/chat/completions":
                    self._reply(404, {"error": {"message": f"no route {self.path}"}})
                    return
                request = json.loads(body)
                time.sleep(server.delay)  # the model thinking: the point of this server
                server.requests += 1
                self._reply(200, chat_completion(request["model"], "Noted.", server.requests))

            def _reply(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the client gave up (the server under test shut down)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def start(self) -> None:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def serve(port_file: str, delay: float) -> None:
    """Run a `SlowChatServer` until terminated (SIGTERM); write its port to `port_file`."""
    server = SlowChatServer(delay)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    server.start()
    Path(port_file).write_text(str(server.httpd.server_address[1]))
    stop.wait()
    server.stop()
