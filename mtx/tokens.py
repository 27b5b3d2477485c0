"""The vocabulary's fixed ids, the same in every SentencePiece model mtx trains (data/vocab.py),
in the model's embedding (its padding row), in batching and in the search."""

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
