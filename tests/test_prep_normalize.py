"""Transcript normalization: numbers, times and ordinals as words; punctuation, case and accents folded."""
import pytest

from asr.data.normalize import normalize, number_words, ordinal_words, time_words


@pytest.mark.parametrize("n, words", [
    (0, "zero"), (7, "seven"), (13, "thirteen"), (20, "twenty"), (42, "forty two"), (100, "one hundred"),
    (101, "one hundred one"), (999, "nine hundred ninety nine"), (1000, "one thousand"),
    (1234, "one thousand two hundred thirty four"), (20_000, "twenty thousand"),
    (999_999, "nine hundred ninety nine thousand nine hundred ninety nine"),
    (1_000_000, "one zero zero zero zero zero zero"),  # beyond the range: digit by digit
])
def test_number_words(n, words):
    assert number_words(n) == words


def test_ordinals_and_times():
    assert [ordinal_words(n) for n in (1, 2, 3, 5, 12, 21, 40, 100)] == [
        "first", "second", "third", "fifth", "twelfth", "twenty first", "fortieth", "one hundredth"]
    assert time_words(7, 30) == "seven thirty"
    assert time_words(7, 5) == "seven oh five"
    assert time_words(7, 0) == "seven o'clock"
    with pytest.raises(ValueError):
        time_words(7, 60)


@pytest.mark.parametrize("raw, norm", [
    ("Set an alarm for 7:30!", "set an alarm for seven thirty"),
    ("Wake me at 6:05 AM.", "wake me at six oh five a m"),
    ("Meet at 10pm", "meet at ten p m"),
    ("It costs $1,250.50 (approx.)", "it costs one thousand two hundred fifty dollars fifty cents approx"),
    ("The 22nd of May", "the twenty second of may"),
    ("50% off & free", "fifty percent off and free"),
    ("pi is 3.14", "pi is three point one four"),
    ("\u2018Tis the dogs\u2019 bone \u2014 don\u2019t!", "tis the dogs bone don't"),
    ("Caf\u00e9   na\u00efve, r\u00e9sum\u00e9", "cafe naive resume"),
    ("He said: \"Hello, world...\"", "he said hello world"),
    ("well-known   multi--word", "well known multi word"),
    ("mp3 player", "mp three player"),
    ("!!! ... ???", ""),
])
def test_normalize(raw, norm):
    assert normalize(raw) == norm


def test_normalized_alphabet():
    out = normalize("Fancy \u00dcber-Text #1: <b>bold</b> @home 100% ~ 'quoted' \t tabs\nnewline")
    assert set(out) <= set("abcdefghijklmnopqrstuvwxyz' ")
    assert "  " not in out and out == out.strip()
    assert normalize(normalize("It's 7:30, isn't it?")) == normalize("It's 7:30, isn't it?")
