"""`chorus stream` against a running `chorus serve` process: a file (at 44.1 kHz stereo, so it
is resampled and mixed) streamed as a shared microphone prints the labelled turns; a refused
token ends with status 1 and the server's reason; a microphone that cannot be opened (the extra
missing, or no PortAudio / no input device on this machine) ends with status 2 and says what.

STT is the local Deepgram-protocol server (it finds the audio in the demo meeting and says its
words, with its speakers), so the turns are exact and the run is quick.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from server.auth import issue_token
from server.testing.harness import SECRET
from tests.serve_process import ServeProcess
from voice.testing.deepgram_server import DeepgramTestServer

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
MEETING = REPO / "examples" / "meeting"
ROOM = "cli-room"


@pytest.fixture
async def serve(tmp_path: Path, deepgram: DeepgramTestServer) -> AsyncIterator[ServeProcess]:
    config = tmp_path / "chorus.toml"
    config.write_text(
        f'[stt]\nprovider = "deepgram"\ndeepgram_url = "{deepgram.url}"\n'
        'deepgram_api_key = "k"\ndiarize = true\n'
        '[diarizer]\nkind = "none"\n[realtime]\nprovider = "none"\n[store]\nurl = "memory://"\n'
    )
    server = await ServeProcess.start(config)
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
def clip(tmp_path: Path) -> Path:
    """The meeting's first 13 s (three voices) as a 44.1 kHz stereo FLAC."""
    audio, rate = sf.read(MEETING / "meeting.wav", dtype="float32")
    import soxr

    part = soxr.resample(audio[: 13 * rate], rate, 44100)
    path = tmp_path / "meeting-start.flac"
    sf.write(path, np.stack([part, part], axis=1), 44100)
    return path


async def chorus(*argv: str, env: dict[str, str] | None = None,
                 prelude: str = "") -> tuple[int, str, str]:
    """`chorus ARGV` as a process: its status, stdout and stderr."""
    code = f"{prelude}\nimport sys\nfrom cli.main import main\nsys.exit(main(sys.argv[1:]))"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, *argv, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    async with asyncio.timeout(120):
        out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_chorus_stream_prints_the_labelled_turns_of_a_file(
    serve: ServeProcess, clip: Path
) -> None:
    token = issue_token(SECRET, ROOM)
    url = f"http://127.0.0.1:{serve.port}"
    status, out, err = await chorus("stream", str(clip), "--url", url, "--room", ROOM,
                                    "--token", token, "--fast")  # fmt: skip
    assert status == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("[00:00.") and 'Speaker A: "Good morning everyone.' in lines[0]
    assert any(' Speaker B: "Morning. The build is green' in line for line in lines)
    assert len({line.split("] ", 1)[1].split(":", 1)[0] for line in lines}) >= 2
    assert "streaming into room cli-room" in err


async def test_chorus_stream_with_a_refused_token_says_why(
    serve: ServeProcess, clip: Path
) -> None:
    url = f"http://127.0.0.1:{serve.port}"
    wrong = issue_token(SECRET, "another-room")
    status, out, err = await chorus("stream", str(clip), "--url", url, "--room", ROOM,
                                    "--token", wrong, "--fast")  # fmt: skip
    assert status == 1
    assert err.strip().splitlines()[-1] == (
        "chorus stream: refused: token is for another room (4404)"
    )
    assert out == ""
    status, _, err = await chorus("stream", str(clip), "--url", url, "--room", ROOM,
                                  "--token", "nonsense")  # fmt: skip
    assert status == 1 and err.strip().startswith("chorus stream: refused: ")


def _machine_has_a_microphone() -> bool:
    probe = "import sounddevice as sd; sd.query_devices(kind='input')"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0


async def test_chorus_stream_mic_without_a_microphone_says_what_is_missing() -> None:
    argv = ("stream", "--mic", "--room", ROOM, "--token", issue_token(SECRET, ROOM))
    # the extra not installed: the one-line hint
    status, out, err = await chorus(*argv, prelude="import sys; sys.modules['sounddevice'] = None")
    assert (status, out) == (2, "")
    assert err.strip() == (
        "chorus stream: chorus stream --mic (the microphone, through sounddevice) needs the "
        "optional extra 'mic': pip install 'chorus[mic]'"
    )
    # this machine's own microphone: PortAudio or an input device missing
    if _machine_has_a_microphone():
        pytest.skip("this machine has a microphone")
    status, out, err = await chorus(*argv)
    assert (status, out) == (2, "")
    [line] = err.strip().splitlines()
    assert line.startswith("chorus stream: no microphone: ")
