"""asr-prep synth on a 20-utterance corpus: manifests, audio format, disjoint splits, determinism, resume,
rejection of unusable synthesizer output, and refusal of reserved voices."""
import hashlib
import json
import os
import shutil

import pytest
import soundfile as sf

from asr.data import DATA_DIR
from asr.data.cli import main
from asr.data.manifest import audio_path, read_manifest
from asr.data.synth import SIZES, plan_corpus, voice_schedule
from asr.data.voices import (ReservedVoiceError, Voice, VoiceConfigError, espeak_variants, load_voices,
                             refuse_reserved)

pytestmark = pytest.mark.skipif(
    not (shutil.which("espeak-ng") and shutil.which("flite") and shutil.which("text2wave")
         and shutil.which("bible") and os.path.isdir("/usr/share/games/fortunes")),
    reason="needs Debian packages espeak-ng flite festival festvox-* fortunes-min fortunes bible-kjv bible-kjv-text")

N = 20
SPLITS = ("train", "dev", "test")


def synth(out, *extra):
    return main(["synth", "--out", str(out), "--size", "tiny", "--seed", "7", "--limit", str(N), *extra])


def md5s(out):
    return {e["id"]: e["md5"] for s in SPLITS for e in read_manifest(out / f"{s}.jsonl")}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth") / "c"
    assert synth(out, "--jobs", "2") == 0
    return out


def test_manifests_and_audio(corpus):
    ids = set()
    for split in SPLITS:
        entries = read_manifest(corpus / f"{split}.jsonl")
        assert entries, split
        for e in entries:
            assert set(e) >= {"id", "audio_filepath", "duration", "text", "speaker", "md5"}
            assert e["audio_filepath"] == f"audio/{split}/{e['id']}.flac"  # relative to the corpus folder
            path = audio_path(e, corpus / f"{split}.jsonl")
            info = sf.info(path)
            assert (info.samplerate, info.channels, info.format) == (16000, 1, "FLAC")
            assert e["duration"] == pytest.approx(info.frames / 16000, abs=1e-3) and e["duration"] > 0.3
            assert e["md5"] == hashlib.md5(path.read_bytes()).hexdigest()
            assert e["text"] and set(e["text"]) <= set("abcdefghijklmnopqrstuvwxyz' ")
            assert 3 <= len(e["text"].split()) <= 20
            ids.add(e["id"])
    assert len(ids) == N
    assert (corpus / "rejected.jsonl").read_text() == ""


def test_splits_disjoint_by_voice_and_sentence(corpus):
    speakers = {s: {e["speaker"] for e in read_manifest(corpus / f"{s}.jsonl")} for s in SPLITS}
    texts = {s: {e["text"] for e in read_manifest(corpus / f"{s}.jsonl")} for s in SPLITS}
    for a, b in (("train", "dev"), ("train", "test"), ("dev", "test")):
        assert not speakers[a] & speakers[b], (a, b)
        assert not texts[a] & texts[b], (a, b)
    assert speakers["dev"] == {"flite:rms", "espeak:en-us-nyc+f4"}
    assert speakers["test"] == {"festival:cmu_us_slt_arctic_hts", "espeak:en-gb-x-gbcwmd+m6"}


def test_corpus_json(corpus):
    c = json.loads((corpus / "corpus.json").read_text())
    assert c["seed"] == 7 and c["size"] == "tiny" and sum(c["counts"].values()) == N
    assert c["counts"] == {"train": 16, "dev": 2, "test": 2}
    assert set(c["voices"]) == set(SPLITS) and c["vocab_size"] > 20
    assert c["hours"]["total"] == pytest.approx(sum(c["hours"][s] for s in SPLITS), abs=1e-3)
    assert {s["name"] for s in c["text"]["sources"]} == {"fortunes", "kjv"}


def test_same_seed_same_bytes_whatever_the_job_count(corpus, tmp_path):
    assert synth(tmp_path / "again", "--jobs", "1") == 0
    assert md5s(tmp_path / "again") == md5s(corpus)


def test_resume_skips_done_and_regenerates_damaged(corpus, capfd):
    before = md5s(corpus)
    victim = corpus / "audio" / "train" / "train-000003.flac"
    mtimes = {p: p.stat().st_mtime_ns for p in (corpus / "audio").rglob("*.flac")}
    capfd.readouterr()
    assert synth(corpus, "--jobs", "2") == 0
    assert f"({N} already done, skipped)" in capfd.readouterr().err
    assert {p: p.stat().st_mtime_ns for p in (corpus / "audio").rglob("*.flac")} == mtimes

    victim.write_bytes(victim.read_bytes()[:1000])  # damaged: md5 no longer matches the record
    (corpus / "audio" / "dev" / "dev-000001.flac").unlink()  # missing
    assert synth(corpus, "--jobs", "2") == 0
    assert f"({N - 2} already done, skipped)" in capfd.readouterr().err
    assert md5s(corpus) == before
    assert hashlib.md5(victim.read_bytes()).hexdigest() == before["train-000003"]


def test_unusable_synth_output_is_rejected_and_the_rest_kept(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "text").symlink_to(DATA_DIR / "text")
    (data / "voices.yaml").write_text(
        "train:\n  - {engine: espeak, name: en-us}\n  - {engine: espeak, name: xx-no-such-voice}\n"
        "dev:\n  - {engine: espeak, name: en-us-nyc+f4}\ntest:\n  - {engine: flite, name: kal16}\n")
    out = tmp_path / "c"
    args = ["synth", "--out", str(out), "--seed", "1", "--limit", "10", "--data-dir", str(data)]
    assert main(args) == 0
    rejected = [json.loads(x) for x in (out / "rejected.jsonl").read_text().splitlines()]
    assert rejected and all(r["reason"] == "synth_failed" and "xx-no-such-voice" in r["detail"] for r in rejected)
    kept = read_manifest(out / "train.jsonl")
    assert kept and all(e["speaker"] == "espeak:en-us" for e in kept)
    assert len(kept) + len(rejected) == 8
    assert main(args + ["--strict"]) == 1


@pytest.mark.parametrize("engine, name", [("flite", "awb"), ("flite", "awb_time"), ("piper", "en_US-lessac-medium"),
                                          ("espeak", "piper-voice"), ("festival", "cmu_us_awb_cg")])
def test_reserved_voices_are_refused(engine, name, tmp_path):
    with pytest.raises(ReservedVoiceError):
        refuse_reserved(engine, name)
    with pytest.raises(ReservedVoiceError):
        Voice(engine, name, "train")  # checked before the engine name, so piper is refused too
    (tmp_path / "voices.yaml").write_text(f"train:\n  - {{engine: {engine}, name: {name}}}\n"
                                          "dev:\n  - {engine: flite, name: slt}\n"
                                          "test:\n  - {engine: flite, name: kal16}\n")
    with pytest.raises(ReservedVoiceError):
        load_voices(tmp_path)


def test_voice_list_rules():
    voices = load_voices()
    ids = {s: {v.id for v in vs} for s, vs in voices.items()}
    assert not ids["train"] & (ids["dev"] | ids["test"]) and not ids["dev"] & ids["test"]
    assert "festival:cmu_us_slt_arctic_hts" in ids["test"] and "flite:rms" in ids["dev"]
    assert "flite:slt" not in ids["train"] | ids["dev"]        # the test voice's speaker, through flite
    assert {"flite:kal16", "flite:kal", "festival:kal_diphone", "festival:ked_diphone"} <= ids["train"]
    for base in ("flite:kal", "flite:kal16", "festival:kal_diphone", "festival:ked_diphone"):
        assert {f"{base}~f", f"{base}~m"} <= ids["train"]     # derived voices over female and male ranges
    train_variants = {v.name.split("+")[1] for v in voices["train"] if "+" in v.name}
    assert not train_variants & {"f4", "m6"}
    assert train_variants == set(espeak_variants()) - {"f4", "m6"}   # every other espeak-ng variant trains
    for base in ("pico:en-US", "pico:en-GB"):                   # SVOX Pico's two women, and a man from each
        assert {base, f"{base}~f", f"{base}~m"} <= ids["train"]
    speakers = {s: {v.speaker for v in vs} for s, vs in voices.items()}
    assert not speakers["dev"] & speakers["test"]
    weight = {e: sum(v.weight for v in voices["train"] if v.engine == e)
              for e in ("espeak", "flite", "festival", "pico")}
    # a third of the audio each: espeak-ng, the diphone men, Pico's HMM women
    assert weight["espeak"] == pytest.approx(weight["flite"] + weight["festival"]) == pytest.approx(weight["pico"])


def _voices_yaml(tmp_path, train, dev, test):
    (tmp_path / "voices.yaml").write_text(f"train:\n{train}dev:\n{dev}test:\n{test}")
    return tmp_path


def test_splits_sharing_a_speaker_are_refused(tmp_path):
    """flite slt and the slt HTS voice are one recorded person: dev and test must not split them."""
    d = _voices_yaml(tmp_path, "  - {engine: flite, name: kal16}\n", "  - {engine: flite, name: slt}\n",
                     "  - {engine: festival, name: cmu_us_slt_arctic_hts}\n")
    with pytest.raises(VoiceConfigError, match="same speaker \\(arctic-slt\\)"):
        load_voices(d)
    d = _voices_yaml(tmp_path, "  - {engine: festival, name: kal_diphone~f, f0: [180, 200], formant: [1.2, 1.2]}\n",
                     "  - {engine: flite, name: kal16}\n", "  - {engine: flite, name: rms}\n")
    with pytest.raises(VoiceConfigError, match="same speaker \\(kal\\)"):   # a derived voice keeps its speaker
        load_voices(d)
    d = _voices_yaml(tmp_path, "  - {engine: espeak, name: en-us+m3}\n", "  - {engine: espeak, name: en-gb+m3}\n",
                     "  - {engine: flite, name: rms}\n")
    with pytest.raises(VoiceConfigError, match="espeak:m3"):
        load_voices(d)


def test_voice_family_and_weighted_schedule(tmp_path):
    d = _voices_yaml(tmp_path, "  - {engine: espeak, variants: all, accents: [en-us, en-gb], weight: 3}\n"
                               "  - {engine: flite, name: kal16, weight: 3}\n",
                     "  - {engine: espeak, name: en-us-nyc+f4}\n", "  - {engine: flite, name: rms}\n")
    voices = load_voices(d)
    family = [v for v in voices["train"] if v.engine == "espeak"]
    assert {v.name for v in family} >= {"en-us", "en-gb"} and not any(v.name.endswith("+f4") for v in family)
    assert sum(v.weight for v in family) == pytest.approx(3.0)
    order = voice_schedule(voices["train"], 600)
    assert sum(v.engine == "flite" for v in order) == 300           # the weights, exactly
    assert max(sum(v.engine == "flite" for v in order[i:i + 10]) for i in range(590)) <= 6   # spread, not runs
    plain = voice_schedule(voices["dev"] + voices["test"], 5)
    assert [v.id for v in plain] == ["espeak:en-us-nyc+f4", "flite:rms"] * 2 + ["espeak:en-us-nyc+f4"]
    with pytest.raises(VoiceConfigError, match="accents must be"):
        load_voices(_voices_yaml(tmp_path, "  - {engine: espeak, variants: all}\n",
                                 "  - {engine: flite, name: rms}\n", "  - {engine: flite, name: kal16}\n"))


def test_full_plan_size_vocabulary_and_disjointness():
    specs, _, _ = plan_corpus("full", 0)
    assert len(specs) == SIZES["full"] >= 20000
    assert len({w for s in specs for w in s.text.split()}) >= 5000
    assert len({s.text for s in specs}) == len(specs)
    by_split = {sp: {s.speaker for s in specs if s.split == sp} for sp in SPLITS}
    assert not by_split["train"] & (by_split["dev"] | by_split["test"])


def test_train_count_leaves_dev_and_test_unchanged():
    """--train N changes only the training split: a run on more training data is scored on the same test set."""
    base, _, _ = plan_corpus("small", 0)
    big, _, _ = plan_corpus("small", 0, train=6000)
    held = lambda specs: [s for s in specs if s.split != "train"]
    assert held(big) == held(base)
    train = [s for s in big if s.split == "train"]
    assert len(train) == 6000 and len({s.text for s in big}) == len(big)
    assert not {s.text for s in train} & {s.text for s in held(big)}
    assert {s.domain for s in train} == {"command", "open"}
    with pytest.raises(ValueError, match="--train"):
        plan_corpus("small", 0, train=0)


@pytest.mark.parametrize("engine,name", [("festival", "kal_diphone"), ("flite", "kal16")])
def test_derived_female_voice_has_raised_f0_and_the_same_duration(engine, name, tmp_path):
    import librosa
    import numpy as np

    text = "Please set an alarm for seven tomorrow morning."
    plain, derived = tmp_path / "plain.wav", tmp_path / "derived.wav"
    Voice(engine, name, "train").synthesize(text, {"stretch": 1.0}, plain)
    Voice(engine, f"{name}~f", "train").synthesize(text, {"stretch": 1.0, "f0": 200, "formant": 1.2}, derived)
    (y0, sr0), (y1, sr1) = sf.read(plain), sf.read(derived)
    assert sr1 == sr0
    assert abs(len(y1) / len(y0) - 1) < 0.1  # slower synthesis, then 1.2x faster playback
    f0 = lambda y, sr: float(np.nanmedian(librosa.pyin(y.astype(np.float32), fmin=60, fmax=400, sr=sr)[0]))
    assert f0(y0, sr0) < 120 and 170 < f0(y1, sr1) < 230


def test_derived_voice_rules(tmp_path):
    with pytest.raises(ValueError, match="name it kal16~TAG"):
        Voice("flite", "kal16", "train", f0=(180, 200))
    with pytest.raises(ValueError, match="honours F0 targets"):
        Voice("flite", "rms~f", "train", f0=(180, 200))
    v = Voice("festival", "ked_diphone~f", "train", stretch=(1.0, 1.0), f0=(190, 190), formant=(1.2, 1.2))
    p = v.draw_params(__import__("random").Random(0))
    assert p == {"stretch": 1.0, "f0": 190, "formant": 1.2} and v.program_voice == "ked_diphone"
    argv, _ = v.command("hello", p, tmp_path / "x.wav")
    assert "(voice_ked_diphone)" in argv and any("Duration_Stretch 1.2)" in a for a in argv)
    assert any("target_f0_mean 158.3" in a for a in argv)  # 190 / 1.2 before the resampling raises it


def test_pico_voices_speak_and_derived_ones_move_f0_but_not_duration(tmp_path):
    """SVOX Pico (PyPI ttspico) runs in-process: the plain US voice is a woman, its ~m derivative a man, at the
    same duration (Pico speaks faster and higher by 1/formant, then the resampling undoes both)."""
    import librosa
    import numpy as np

    text = "Please set an alarm for seven tomorrow morning."
    plain, male = tmp_path / "plain.wav", tmp_path / "male.wav"
    Voice("pico", "en-US", "train").synthesize(text, {"stretch": 1.0}, plain)
    v = Voice("pico", "en-US~m", "train", stretch=(1.0, 1.0), f0=(110, 110), formant=(0.88, 0.88))
    params = v.draw_params(__import__("random").Random(0))
    assert v.pico_settings(params) == {"rate": 114, "pitch": 76}   # 100 / 0.88; 110 Hz / 0.88 / 164 Hz
    v.synthesize(text, params, male)
    (y0, sr0), (y1, sr1) = sf.read(plain), sf.read(male)
    assert sr0 == sr1 == 16000
    assert abs(len(y1) / len(y0) - 1) < 0.1
    f0 = lambda y, sr: float(np.nanmedian(librosa.pyin(y.astype(np.float32), fmin=60, fmax=400, sr=sr)[0]))
    assert 150 < f0(y0, sr0) < 180 and 95 < f0(y1, sr1) < 125
    assert v.speaker == "svox-lh0" and Voice("pico", "en-GB", "train").speaker == "svox-kh0"
    again = tmp_path / "again.wav"          # a Pico engine is stateful: each utterance gets a fresh one
    Voice("pico", "en-US", "train").synthesize(text, {"stretch": 1.0}, again)
    assert again.read_bytes() == plain.read_bytes()


def test_pico_rules_name_the_voice():
    with pytest.raises(VoiceConfigError, match="pico:en-AU: Pico has no voice 'en-AU'"):
        Voice("pico", "en-AU", "train").check_installed()
    v = Voice("pico", "en-GB~m", "train", f0=(60, 60), formant=(1.0, 1.0))
    with pytest.raises(RuntimeError, match="pico:en-GB~m: F0 60 Hz .* needs Pico pitch 35%, outside its 50-200%"):
        v.pico_settings({"f0": 60, "formant": 1.0})
    with pytest.raises(ValueError, match="in-process"):
        v.command("hello", {}, "x.wav")
