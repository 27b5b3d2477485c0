"""Jobs over whole files that run a Translator (mtx/decode): a corpus translated into a file,
resumably (translate.py), distillation (distill.py), dual cross-entropy filtering for `mtx
prepare` (dual.py) and lexical shortlists built from prepared data (shortlist.py). They score
through the one public scoring API (decode/score.py's `Scorer.cross_entropies`)."""
