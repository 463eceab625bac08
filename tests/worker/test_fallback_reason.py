"""A run's fallback reason is the extractor's first line, whole where it fits, else cut at a word with an ellipsis."""

from __future__ import annotations

from worker.distribution import REASON_CHARS, first_line_clipped


def test_a_long_reason_is_cut_at_a_word_with_an_ellipsis() -> None:
    reason = "no weights for clip-vit-l-14-336 under /var/lib/ablate/weights: " + "staged-weights-missing " * 20
    clipped = first_line_clipped(reason + "\nsecond line")
    assert len(clipped) <= REASON_CHARS and clipped.endswith("staged-weights-missing…"), clipped
    assert reason.startswith(clipped.removesuffix("…"))


def test_a_short_reason_is_kept_whole_and_only_its_first_line() -> None:
    assert first_line_clipped("no weights staged\ntraceback ...") == "no weights staged"
    assert first_line_clipped("") == ""
