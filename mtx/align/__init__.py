"""Word alignment: which source word a target word came from.

- links.py: the Pharaoh format (`i-j`, 0-based word indices) and gold files with sure and
  possible links (`i-j` and `ipj`), read with one-line errors naming the file and line.
- aer.py: alignment error rate, precision and recall against gold (Och and Ney 2003).
- symmetrise.py: grow-diag-final-and, which joins the two directions of a statistical aligner.
- statistical.py: eflomal in both directions over a corpus, in chunks, symmetrised.
- pieces.py: words as the model's pieces see them: piece links to word links and back.

This package knows no corpus, model or config. The statistical alignments of `mtx prepare`'s
training split, kept beside it for guided alignment training, are data/aligned.py's; the
model's own alignments (its cross-attention, guided or not) are read by decode/align.py.
"""
