"""text: the words for numbers every message uses, against written-out tables."""
from __future__ import annotations

import pytest

from schedc.text import GIB, MAX_SHOWN, agree, gib, listed, more, ordinal, plural, rate


@pytest.mark.parametrize("n,word", [(1, "1st"), (2, "2nd"), (3, "3rd"), (4, "4th"), (11, "11th"), (12, "12th"),
                                    (13, "13th"), (20, "20th"), (21, "21st"), (22, "22nd"), (101, "101st"),
                                    (111, "111th"), (1001, "1,001st")])
def test_ordinal(n, word):
    assert ordinal(n) == word


def test_plural_and_agreement():
    assert (plural(1, "device"), plural(2, "device"), plural(0, "process", "processes")) == \
        ("1 device", "2 devices", "0 processes")
    assert plural(1024, "op") == "1,024 ops"
    assert (agree(1, "needs", "need"), agree(3, "needs", "need")) == ("needs", "need")


def test_a_list_is_cut_at_one_cap():
    items = [str(k) for k in range(MAX_SHOWN + 5)]
    assert listed(items) == ", ".join(items[:MAX_SHOWN]) + " ... and 5 more"
    assert listed(items[:3]) == "0, 1, 2"
    assert more(1234, "devices") == "... and 1,234 more devices"


def test_bytes_in_gib():
    assert GIB == 1024 ** 3 and gib(3 * GIB) == "3.00" and gib(1.5 * GIB, 0) == "2"


def test_rates_keep_their_digits():
    assert (rate(174.93), rate(1.25), rate(0.0123), rate(0.0)) == ("174.9", "1.2", "0.0123", "0")
