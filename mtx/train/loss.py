"""Label-smoothed cross-entropy (paper section 5.4, epsilon = 0.1).

The smoothed target puts 1 - eps on the reference token and spreads eps uniformly over all V
classes, the convention of `F.cross_entropy(label_smoothing=eps)`:

    loss_t = (1 - eps) * -log p(y_t) + eps / V * sum_v -log p(v)

Padding positions contribute nothing. Both functions return sums over tokens; the caller
divides by the number of target tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor


def label_smoothed_nll(
    logits: Tensor, target: Tensor, eps: float, pad_id: int
) -> tuple[Tensor, Tensor]:
    """logits (..., V), target (...) -> (smoothed loss sum, plain NLL sum) over non-pad tokens."""
    lprobs = torch.log_softmax(logits.float(), dim=-1).flatten(0, -2)  # (N, V)
    target = target.flatten()  # (N,)
    keep = target != pad_id
    nll = -lprobs.gather(1, target.clamp(min=0).unsqueeze(1)).squeeze(1)  # (N,)
    smooth = -lprobs.mean(dim=-1)  # (N,): eps/V * sum_v -log p(v), divided by eps
    nll = nll.masked_fill(~keep, 0.0).sum()
    smooth = smooth.masked_fill(~keep, 0.0).sum()
    return (1.0 - eps) * nll + eps * smooth, nll
