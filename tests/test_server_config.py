"""Reading `chorus.toml` (issue 24.5): an empty string means unset, in a file as in the
environment, and keys that only one diarizer reads are refused with the others when the config is
read — not by every stream that opens afterwards."""

from __future__ import annotations

from pathlib import Path

import pytest

from server.config import ConfigError, load_config


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "chorus.toml"
    path.write_text(text)
    return path


def test_an_empty_string_in_the_file_is_the_default_as_in_the_environment(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '[stt]\nmodel = ""\nlanguage = ""\n[diarizer]\npipeline = ""\nhf_token = ""\n'
        '[chat]\nbase_url = ""\nmodel = ""\n[agent]\ncwd = ""\n',
    )
    from_file = load_config(path, environ={})
    from_env = load_config(environ={"CHORUS_STT_MODEL": "", "CHORUS_DIARIZER_PIPELINE": ""})
    default = load_config(environ={})
    for config in (from_file, from_env):
        assert config.stt.model is None and config.diarizer.pipeline is None
        assert config.model_dump() == default.model_dump()


def test_a_set_value_is_kept(tmp_path: Path) -> None:
    path = write(tmp_path, '[stt]\nmodel = "base"\n[policy]\nassistant_name = ""\n')
    config = load_config(path, environ={})
    assert config.stt.model == "base"
    assert config.policy.assistant_name == ""  # a plain string, not an optional one: kept


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[diarizer]\npipeline = "./my-pipeline"\n', 'diarizer: .*pipeline is for kind = "pyannote"'),
        (
            '[diarizer]\nkind = "none"\npipeline = "p"\nhf_token = "hf_x"\n',
            "pipeline and hf_token are for kind = \"pyannote\" \\(kind is 'none'\\)",
        ),
        ("[diarizer]\nnum_speakers = 0\n", "diarizer.num_speakers"),
    ],
)
def test_diarizer_keys_the_kind_does_not_read_are_refused_at_load(
    tmp_path: Path, text: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, text), environ={})


def test_pyannote_keys_with_the_pyannote_kind_load(tmp_path: Path) -> None:
    path = write(tmp_path, '[diarizer]\nkind = "pyannote"\npipeline = "./my-pipeline"\n')
    assert load_config(path, environ={}).diarizer.pipeline == "./my-pipeline"


def test_the_pyannote_stage_runs_on_one_torch_thread_unless_told(tmp_path: Path) -> None:
    """`[diarizer] torch_threads` (docs/pyannote.md, *Threads*): 1 by default for the pyannote
    stage, 0 for torch's own setting, and nothing for the embedded stage (onnxruntime's)."""
    pyannote = write(tmp_path, '[diarizer]\nkind = "pyannote"\n')
    assert load_config(pyannote, environ={}).diarizer.pyannote_threads() == 1
    mine = write(tmp_path, '[diarizer]\nkind = "pyannote"\ntorch_threads = 4\n')
    assert load_config(mine, environ={}).diarizer.pyannote_threads() == 4
    torch_own = write(tmp_path, '[diarizer]\nkind = "pyannote"\ntorch_threads = 0\n')
    assert load_config(torch_own, environ={}).diarizer.pyannote_threads() is None
    embedded = write(tmp_path, "[diarizer]\ntorch_threads = 2\n")
    assert load_config(embedded, environ={}).diarizer.pyannote_threads() is None
    with pytest.raises(ConfigError, match="torch_threads"):
        load_config(write(tmp_path, "[diarizer]\ntorch_threads = -1\n"), environ={})
