"""Reconnect voices: the cosine a voice needs to keep its letter after an STT reconnect (V4).

`chorus bench reconnect_voices DIR ...` replays, on every recording in the directories that has a
reference RTTM (a `<name>.rttm` beside it, or the AMI folder's `train.rttm`), what
`voice.speakers.SpeakerContinuity` sees after a reconnect: for each reference turn of at least
1 s of speech nobody else talks over, the voiceprint of its first 4 s (one STT result's words)
against the voiceprint of every speaker heard before it, each from that speaker's last 20 s
(`HISTORY_SECONDS`), with the default CAM++ embedder.

Two errors follow from a threshold: a **miss** (the voice's best match is its own speaker, below
the threshold: it becomes a new letter) and a **wrong name** (a voice nobody had heard, or one
whose best match is another speaker, at or above it). The threshold is chosen by leave-one-file-
out, minimising miss rate + 2 × wrong-name rate on the other files (a wrong name is worse than a
new letter); the held-out files' errors are the figure to expect. Prints a table per threshold,
the cross-validated choice, and writes every trial with `--json`.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

CLIP_SECONDS = 4.0
MIN_TURN_SECONDS = 1.0


@dataclass(frozen=True)
class Trial:
    file: str
    speaker: str
    seconds: float
    own: float | None
    """Cosine with the speaker's own voiceprint (None: the speaker had not spoken yet)."""
    other: float | None
    """The best cosine with another speaker's voiceprint (None: nobody else had spoken)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dirs", nargs="+", type=Path, help="folders of recordings with RTTMs")
    parser.add_argument("--json", type=Path, help="write every trial here")


def run(args: argparse.Namespace) -> int:
    trials: list[Trial] = []
    for path in _recordings(args.dirs):
        found = list(_trials(path))
        trials += found
        print(f"  {path.stem}: {len(found)} turns", flush=True)
    if args.json:
        args.json.write_text(json.dumps([asdict(t) for t in trials], indent=1))
    grid = [round(0.40 + 0.01 * i, 2) for i in range(46)]
    print("threshold  miss        wrong name")
    for threshold in (0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8):
        miss, wrong = rates(trials, threshold)
        print(f"{threshold:9.2f}  {100 * miss:5.1f} %     {100 * wrong:5.1f} %")
    files = sorted({t.file for t in trials})
    chosen: list[float] = []
    held_out: list[Trial] = []
    errors = [0.0, 0.0]
    for held in files:
        train = [t for t in trials if t.file != held]
        best = min(grid, key=lambda th: cost(train, th))
        chosen.append(best)
        test = [t for t in trials if t.file == held]
        held_out += test
        miss, wrong = counts(test, best)
        errors[0] += miss
        errors[1] += wrong
    known, unknown = _denominators(held_out)
    print(f"leave-one-file-out over {len(files)} files: thresholds {min(chosen):.2f}–{max(chosen):.2f} "
          f"(median {statistics.median(chosen):.2f}); held out: miss {100 * errors[0] / known:.1f} %, "
          f"wrong name {100 * errors[1] / unknown:.1f} %")
    return 0


def _denominators(trials: list[Trial]) -> tuple[int, int]:
    known = sum(t.own is not None for t in trials)
    return max(known, 1), max(known + sum(t.other is not None for t in trials), 1)


def counts(trials: Iterable[Trial], threshold: float) -> tuple[int, int]:
    """(misses, wrong names) at `threshold`. A trial whose speaker was heard is a match to make;
    every trial with another speaker heard is also scored as if its own speaker were new."""
    miss = wrong = 0
    for t in trials:
        if t.own is not None:
            best_other = t.other if t.other is not None else -1.0
            if max(t.own, best_other) < threshold:
                miss += 1
            elif best_other > t.own:
                wrong += 1
        if t.other is not None and t.other >= threshold:
            wrong += 1
    return miss, wrong


def rates(trials: list[Trial], threshold: float) -> tuple[float, float]:
    miss, wrong = counts(trials, threshold)
    known, trials_n = _denominators(trials)
    return miss / known, wrong / trials_n


def cost(trials: list[Trial], threshold: float) -> float:
    miss, wrong = rates(trials, threshold)
    return miss + 2 * wrong


def _recordings(dirs: list[Path]) -> list[Path]:
    found = []
    for folder in dirs:
        for path in sorted([*folder.glob("*.wav"), *folder.glob("*.flac")]):
            if path.with_suffix(".rttm").exists() or (folder / "train.rttm").exists():
                found.append(path)
    return [p for p in found if not p.stem.startswith("enroll")]


def _reference(path: Path) -> list[tuple[float, float, str]]:
    rttm = path.with_suffix(".rttm")
    if not rttm.exists():
        rttm = path.parent / "train.rttm"
    turns = []
    for line in rttm.read_text().splitlines():
        fields = line.split()
        if len(fields) >= 8 and fields[1] == path.stem:
            start = float(fields[3])
            turns.append((start, start + float(fields[4]), fields[7]))
    return sorted(turns)


def _alone(turn: tuple[float, float, str], turns: list[tuple[float, float, str]]) -> list[tuple[float, float]]:
    """The parts of `turn` nobody else talks over."""
    parts = [(turn[0], turn[1])]
    for start, end, who in turns:
        if who == turn[2]:
            continue
        kept = []
        for a, b in parts:
            if end <= a or start >= b:
                kept.append((a, b))
                continue
            if start > a:
                kept.append((a, start))
            if end < b:
                kept.append((end, b))
        parts = kept
    return [(a, b) for a, b in parts if b - a > 0.05]


def _trials(path: Path) -> Iterable[Trial]:
    from voice.audio import read_audio_16k
    from voice.centroids import unit_or_none
    from voice.embedding import default_embedding_model
    from voice.speakers import HISTORY_SECONDS, MIN_EMBED_SECONDS

    model = default_embedding_model()
    audio = read_audio_16k(path)

    def clip(spans: list[tuple[float, float]]) -> npt.NDArray[np.float32] | None:
        pieces = [audio[int(a * 16000) : int(b * 16000)] for a, b in spans]
        joined = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
        if len(joined) < 1600:
            return None
        if len(joined) < MIN_EMBED_SECONDS * 16000:
            joined = np.tile(joined, int(np.ceil(MIN_EMBED_SECONDS * 16000 / len(joined))))
        return unit_or_none(model.voiceprint(joined))

    def first(spans: list[tuple[float, float]], seconds: float, *, last: bool = False) -> list[tuple[float, float]]:
        out, total = [], 0.0
        for a, b in reversed(spans) if last else spans:
            if total >= seconds:
                break
            take = min(b - a, seconds - total)
            out.append((b - take, b) if last else (a, a + take))
            total += take
        return out

    turns = _reference(path)
    history: dict[str, list[tuple[float, float]]] = {}
    for turn in turns:
        alone = _alone(turn, turns)
        seconds = sum(b - a for a, b in alone)
        if seconds >= MIN_TURN_SECONDS and history:
            new = clip(first(alone, CLIP_SECONDS))
            sims: dict[str, float] = {}
            for speaker, spans in history.items():
                known = clip(first(spans, HISTORY_SECONDS, last=True))
                if new is not None and known is not None:
                    sims[speaker] = float(new @ known)
            others = [v for k, v in sims.items() if k != turn[2]]
            yield Trial(path.stem, turn[2], round(min(seconds, CLIP_SECONDS), 2),
                        sims.get(turn[2]), max(others) if others else None)
        history.setdefault(turn[2], []).extend(alone)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(parser)
    raise SystemExit(run(parser.parse_args()))
