"""Transcript normalization shared by synthesis, import and scoring.

One function, :func:`normalize`, so that references, synthesized text and decoder hypotheses are compared in the
same alphabet: lowercase a-z, apostrophe, single spaces, numbers written as words, all other punctuation removed.
"""
import re
import unicodedata

_ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
         "sixteen seventeen eighteen nineteen").split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
_ORDINAL_IRREGULAR = {"one": "first", "two": "second", "three": "third", "five": "fifth", "eight": "eighth",
                      "nine": "ninth", "twelve": "twelfth"}
MAX_NUMBER = 999_999


def number_words(n: int) -> str:
    """Cardinal in words for 0..999999, American style without "and": 1234 -> "one thousand two hundred thirty four".

    Larger numbers are read digit by digit (phone-number style), which is also how speakers read long digit strings.
    """
    if n < 0:
        return "minus " + number_words(-n)
    if n > MAX_NUMBER:
        return " ".join(_ONES[int(d)] for d in str(n))
    if n < 20:
        return _ONES[n]
    if n < 100:
        tens, ones = divmod(n, 10)
        return _TENS[tens] + ("" if ones == 0 else " " + _ONES[ones])
    if n < 1000:
        hundreds, rest = divmod(n, 100)
        return _ONES[hundreds] + " hundred" + ("" if rest == 0 else " " + number_words(rest))
    thousands, rest = divmod(n, 1000)
    return number_words(thousands) + " thousand" + ("" if rest == 0 else " " + number_words(rest))


def ordinal_words(n: int) -> str:
    """Ordinal in words: 1 -> "first", 22 -> "twenty second", 40 -> "fortieth"."""
    words = number_words(n).split()
    last = words[-1]
    if last in _ORDINAL_IRREGULAR:
        last = _ORDINAL_IRREGULAR[last]
    elif last.endswith("y"):
        last = last[:-1] + "ieth"
    else:
        last += "th"
    return " ".join(words[:-1] + [last])


def time_words(hours: int, minutes: int) -> str:
    """Clock time as spoken: 7:30 -> "seven thirty", 7:05 -> "seven oh five", 7:00 -> "seven o'clock"."""
    if not (0 <= hours <= 24 and 0 <= minutes <= 59):
        raise ValueError(f"not a clock time: {hours}:{minutes:02d}")
    if minutes == 0:
        return number_words(hours) + " o'clock"
    if minutes < 10:
        return number_words(hours) + " oh " + number_words(minutes)
    return number_words(hours) + " " + number_words(minutes)


def _digits(s: str) -> str:
    return " ".join(_ONES[int(d)] for d in s)


def _dollars(whole: str, cents: str | None) -> str:
    out = f" {whole} dollar" + ("" if whole == "1" else "s")
    if cents and int(cents):
        out += f" {int(cents)} cent" + ("" if int(cents) == 1 else "s")
    return out + " "


_SUBS = [  # (pattern, replacement) applied in order, before lowercasing and the final character filter
    (re.compile(r"[\u2018\u2019\u02bc\u0060\u00b4]"), "'"),
    (re.compile(r"[\u201c\u201d\u00ab\u00bb]"), '"'),
    (re.compile(r"[\u2010-\u2015]"), " "),
    (re.compile(r"&"), " and "),
    (re.compile(r"@"), " at "),
    (re.compile(r"(\d)\s*%"), r"\1 percent"),
    (re.compile(r"(?<=\d)\s*([ap])\.?m\.?(?![a-z])", re.I), r" \1 m"),
    (re.compile(r"\b(\d{1,2}):(\d{2})\b"), lambda m: " " + time_words(int(m[1]), int(m[2])) + " "
        if int(m[1]) <= 24 and int(m[2]) <= 59 else f" {m[1]} {m[2]} "),
    (re.compile(r"\b\d{1,3}(?:,\d{3})+\b"), lambda m: m[0].replace(",", "")),
    (re.compile(r"\$(\d+)(?:\.(\d\d))?\b"), lambda m: _dollars(m[1], m[2])),
    (re.compile(r"\b(\d+)(st|nd|rd|th)\b", re.I), lambda m: " " + ordinal_words(int(m[1])) + " "),
    (re.compile(r"(\d+)\.(\d+)"), lambda m: f" {m[1]} point {_digits(m[2])} "),
    (re.compile(r"\d+"), lambda m: " " + number_words(int(m[0])) + " "),
]
_APOSTROPHE_NOT_IN_WORD = re.compile(r"(?<![a-z])'|'(?![a-z])")
_NOT_ALLOWED = re.compile(r"[^a-z' ]+")
_SPACES = re.compile(r" +")


def normalize(text: str) -> str:
    """Normalize a transcript: lowercase a-z and apostrophe, single spaces, numbers and times as words.

    Accents are folded (cafe for café); apostrophes survive only inside words (don't, o'clock); every other
    character becomes a word boundary.
    """
    for pattern, repl in _SUBS:
        text = pattern.sub(repl, text)
    text = unicodedata.normalize("NFKD", text)
    text = "".join(c for c in text if not unicodedata.combining(c)).lower()
    text = _NOT_ALLOWED.sub(" ", text)
    text = _APOSTROPHE_NOT_IN_WORD.sub(" ", text)
    return _SPACES.sub(" ", text).strip()
