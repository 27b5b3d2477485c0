"""Word alignment without a model (mtx/align/): the Pharaoh and gold formats and their errors,
AER, grow-diag-final-and, words read from pieces, the toy corpus's gold links, eflomal through
`mtx align`."""

from __future__ import annotations

import pytest
from helpers.common import invoke, mtx

from mtx.align import aer, pieces
from mtx.align.links import Alignments, format_links, parse_links, read_links
from mtx.align.statistical import align_pairs
from mtx.align.symmetrise import grow_diag_final_and
from mtx.data import toy
from mtx.errors import MtxError


def test_aer_precision_and_recall_follow_och_and_ney():
    sure = {(0, 0), (1, 1)}
    gold = Alignments([sure], [sure | {(1, 2)}])
    # A = {(0,0), (1,2), (2,2)}: |A&S| = 1, |A&P| = 2, |A| = 3, |S| = 2
    got = aer.score([{(0, 0), (1, 2), (2, 2)}], gold)
    assert got.aer == pytest.approx(1 - 3 / 5)
    assert got.precision == pytest.approx(2 / 3) and got.recall == pytest.approx(1 / 2)
    assert aer.score([sure], gold).aer == 0.0
    # summed over the corpus before dividing, not averaged per pair
    two = Alignments([sure, {(0, 0)}], [sure, {(0, 0)}])
    assert aer.score([sure, set()], two).aer == pytest.approx(1 - 4 / 5)


def test_gold_files_count_from_one_and_mark_possible_links(tmp_path):
    (tmp_path / "g").write_text("1-1 2p3\n\n")
    gold = read_links(tmp_path / "g", ["a b", "c"], ["x y z", "w"], gold=True, one_based=True)
    assert gold.sure == [{(0, 0)}, set()]
    assert gold.possible == [{(0, 0), (1, 2)}, set()]


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "0-0\n0-5\n",
            r"l, line 2: link '0-5' is out of range: the pair has 2 source and 2 target",
        ),
        ("0-0\n0:1\n", r"l, line 2: '0:1' is not a link \(i-j"),
        ("0-0\n0p1\n", r"l, line 2: '0p1' is not a link"),  # no possible links outside gold
        ("0-0\n", r"l: 1 lines, but the corpus has 2 sentence pairs"),
    ],
)
def test_a_bad_alignment_file_is_refused_naming_its_line(tmp_path, text, message):
    (tmp_path / "l").write_text(text)
    with pytest.raises(MtxError, match=message):
        read_links(tmp_path / "l", ["a b", "c d"], ["x y", "z w"])


def test_align_score_refuses_bad_links_in_one_line_and_scores_good_ones(tmp_path):
    for name, text in {"s": "a b\nc\n", "t": "x y\nz\n", "g": "1-1 2-2\n1-1\n"}.items():
        (tmp_path / name).write_text(text)
    files = ["--src", tmp_path / "s", "--tgt", tmp_path / "t", "--gold", tmp_path / "g"]
    (tmp_path / "bad").write_text("0-0 1-1\n3-0\n")
    out = invoke("align", "score", *files, "--links", tmp_path / "bad")
    assert out.exit_code == 2
    assert out.output.strip().endswith("bad, line 2: link '3-0' is out of range: the pair has 1 "
                                       "source and 1 target words")  # fmt: skip
    assert len(out.output.strip().splitlines()) == 1
    (tmp_path / "good").write_text("0-0 1-1\n0-0\n")
    out = mtx("align", "score", *files, "--links", tmp_path / "good", "--json")
    assert '"aer": 0.0' in out.output
    (tmp_path / "rev").write_text("1-1 0-0\n0-0\n")  # the same links read target-source
    out = mtx("align", "score", *files, "--links", tmp_path / "rev", "--reverse", "--json")
    assert '"aer": 0.0' in out.output


def test_grow_diag_final_and():
    # the intersection grows into neighbouring union links with an unaligned word
    f, b = {(0, 0), (1, 1), (2, 1)}, {(0, 0), (1, 1), (1, 2)}
    assert grow_diag_final_and(f, b) == {(0, 0), (1, 1), (2, 1), (1, 2)}
    # final-and: a lone link of one direction joins if both its words are unaligned ...
    assert grow_diag_final_and({(0, 0), (3, 3)}, {(0, 0)}) == {(0, 0), (3, 3)}
    # ... and not if one of them is aligned and it is no neighbour
    assert grow_diag_final_and({(0, 0), (0, 3)}, {(0, 0)}) == {(0, 0)}
    # a neighbour whose both words are aligned already is not added
    f, b = {(0, 0), (1, 1), (0, 1)}, {(0, 0), (1, 1)}
    assert grow_diag_final_and(f, b) == {(0, 0), (1, 1)}


def test_words_are_read_from_pieces():
    M = pieces.MARK
    ps = [None, f"{M}Ha", "us", M, ",", f"{M}da", "s", None]  # a tag, ..., EOS
    assert pieces.word_index(ps) == [None, 0, 0, None, 1, 2, 2, None]
    assert pieces.words(ps) == ["Haus", ",", "das"]
    src, tgt = pieces.word_index(ps), pieces.word_index([f"{M}the", f"{M}ho", "use"])
    word_links = {(0, 1), (2, 0)}  # Haus-house, das-the
    piece_links = pieces.to_pieces(word_links, src, tgt)
    assert piece_links == [(1, 1), (1, 2), (2, 1), (2, 2), (5, 0), (6, 0)]
    assert pieces.to_words(piece_links, src, tgt) == word_links
    # a link to a piece of no word (a tag, EOS) is no word link
    assert pieces.to_words([(0, 0), (7, 1)], src, tgt) == set()


def test_attention_over_pieces_becomes_attention_over_words():
    """pieces.word_matrix: a target word's row is its pieces' mean, a source word's column its
    pieces' sum, and attention on pieces that are no word goes to the null column."""
    import numpy as np

    src = pieces.word_index(["\u2581the", "\u2581dog", "gy", None])  # the dog|gy EOS
    tgt = pieces.word_index(["\u2581der", "\u2581hun", "d", None])  # der hun|d EOS
    attention = np.array(
        [[0.7, 0.1, 0.1, 0.1], [0.1, 0.3, 0.4, 0.2], [0.0, 0.1, 0.1, 0.8], [0.25] * 4]
    )
    words = pieces.word_matrix(attention, src, tgt)
    expected = [[0.7, 0.2, 0.1], [0.05, 0.45, 0.5]]  # (der, hund) x (the, doggy, null)
    np.testing.assert_allclose(words, expected, atol=1e-12)
    assert words.sum(1).tolist() == pytest.approx([1.0, 1.0])


def test_the_toy_generator_says_its_word_links():
    pairs, links = toy.split_pairs("test"), toy.alignments("test")
    assert len(links) == len(pairs)
    for (en, de), pair in zip(pairs, links):
        n, m = len(en.split()), len(de.split())
        assert pair and all(0 <= i < n and 0 <= j < m for i, j in pair)
    assert pairs[1] == ("the dog does not show a table to a friend.",
                        "der hund zeigt einem freund einen tisch nicht.")  # fmt: skip
    # der-the, hund-dog, nicht-not, zeigt-show, einen tisch-a table, einem freund-a friend
    assert links[1] == {(0, 0), (1, 1), (3, 7), (4, 2), (5, 5), (6, 6), (8, 3), (9, 4)}


def test_eflomal_learns_the_toy_corpus_links():
    pairs = toy.split_pairs("train")[:3000]
    gold = toy.alignments("train")[:3000]
    got = list(align_pairs(pairs + [("", "x")], chunk=1000, samplers=2))
    assert len(got) == 3001 and got[-1] == set()  # an empty side: no link, the order kept
    score = aer.score(got[:3000], Alignments(list(gold), list(gold)))
    assert score.aer < 0.2, score


def test_align_corpus_writes_pharaoh_lines(tmp_path):
    pairs = toy.split_pairs("train")[:400]
    (tmp_path / "c.en").write_text("".join(en + "\n" for en, _ in pairs))
    (tmp_path / "c.de").write_text("".join(de + "\n" for _, de in pairs))
    mtx("align", "corpus", "--src", tmp_path / "c.en", "--tgt", tmp_path / "c.de",
        "--output", tmp_path / "links", "--samplers", "2")  # fmt: skip
    links = read_links(tmp_path / "links", [e for e, _ in pairs], [d for _, d in pairs])
    assert len(links) == 400 and sum(map(len, links.sure)) > 400 * 4
    (tmp_path / "short.de").write_text("eins\n")
    out = invoke("align", "corpus", "--src", tmp_path / "c.en", "--tgt", tmp_path / "short.de",
                 "--output", tmp_path / "none")  # fmt: skip
    assert (
        out.exit_code == 2
        and "short.de: 1 lines, but" in out.output
        and "c.en has more" in out.output
    )
    assert not (tmp_path / "none").exists()
    for samplers in ("1", "9", "-1"):  # eflomal runs 2 to 8 (0: one a core)
        for command in (["corpus", "--src", tmp_path / "c.en", "--tgt", tmp_path / "c.de",
                         "--output", tmp_path / "none"], ["prepared"]):  # fmt: skip
            out = invoke("align", *command, "--samplers", samplers)
            assert out.exit_code == 2 and out.output.count("\n") == 1, out.output
            assert f"--samplers {samplers}: eflomal runs 2 to 8 samplers" in out.output
    assert not (tmp_path / "none").exists()


def test_format_links_sorts_and_parses_back():
    links = {(2, 1), (0, 0), (1, 3)}
    text = format_links(links)
    assert text == "0-0 1-3 2-1"
    assert parse_links(text, "x")[0] == links
