"""Evaluation windows: start like a document, context-only positions, far positions reached."""

from __future__ import annotations

import pytest

from day0.torchkit.evaltext import prefix_token, windows
from day0.errors import ConfigError


def test_windows_start_with_the_prefix_and_skip_context_positions():
    ids = list(range(100, 1100))
    wins, notes = windows(ids, seq_len=256, max_windows=3, prefix=1, context_tokens=8)
    assert len(wins) == 3 and not notes
    assert all(w.ids[0] == 1 and len(w.ids) == 256 and w.score_from == 8 for w in wins)
    # consecutive, non-overlapping text: window k continues where k-1 stopped
    assert wins[1].ids[1] == wins[0].ids[-1] + 1 and wins[1].text_offset == 255


def test_without_a_prefix_the_context_still_precedes_every_scored_position():
    wins, _ = windows(list(range(600)), seq_len=200, max_windows=2, prefix=None,
                      context_tokens=8)
    assert wins[0].ids[0] == 0 and wins[0].score_from == 8 and len(wins[0].ids) == 200


def test_a_short_text_is_repeated_to_reach_the_far_positions_and_says_so():
    wins, notes = windows(list(range(10, 60)), seq_len=512, max_windows=4, prefix=1,
                          context_tokens=8)
    assert len(wins) == 1 and len(wins[0].ids) == 512
    assert "repeated" in notes[0] and "50 tokens" in notes[0]


def test_degenerate_inputs_are_config_errors():
    with pytest.raises(ConfigError, match="fewer than 2 tokens"):
        windows([5], 16, 1)
    with pytest.raises(ConfigError, match="seq_len"):
        windows(list(range(50)), 2, 1, prefix=1)


def test_prefix_token_prefers_bos_then_eos():
    class Tok:
        bos_token_id, eos_token_id = None, 7
    assert prefix_token(Tok()) == 7
    Tok.bos_token_id = 3
    assert prefix_token(Tok()) == 3
    Tok.bos_token_id = Tok.eos_token_id = None
    assert prefix_token(Tok()) is None
