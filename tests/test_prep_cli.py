"""asr-prep's command line: every subcommand has a --help that explains it; bad arguments are usage errors."""
import pytest

from asr.data.cli import build_parser, main


@pytest.mark.parametrize("command, phrase", [
    ("synth", "disjoint by voice and by sentence"), ("import", "rejected.jsonl"),
    ("tokenizer", "unigram"), ("stats", "mean and variance"), ("baseline", "pocketsphinx"),
])
def test_subcommand_help(command, phrase, capsys):
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0
    assert phrase in " ".join(capsys.readouterr().out.split())


def test_usage_errors():
    with pytest.raises(SystemExit) as e:
        main(["synth", "--out", "x", "--size", "huge"])
    assert e.value.code == 2
    assert "--limit" not in build_parser().format_help()


def test_bad_manifest_is_reported_with_file_and_line(tmp_path, capfd):
    (tmp_path / "m.jsonl").write_text("{oops\n")
    assert main(["stats", "--manifest", str(tmp_path / "m.jsonl"), "--out", str(tmp_path / "s")]) == 2
    assert f"{tmp_path / 'm.jsonl'}:1: invalid JSON" in capfd.readouterr().err
