"""Label-smoothed cross-entropy (paper section 5.4, epsilon = 0.1).

The smoothed target puts 1 - eps on the reference token and spreads eps uniformly over all V
classes, the convention of `F.cross_entropy(label_smoothing=eps)`:

    loss_t = (1 - eps) * -log p(y_t) + eps / V * sum_v -log p(v)

Padding positions contribute nothing. Both functions return sums over tokens; the caller
divides by the number of target tokens.

`label_smoothed_nll` takes the logits. `output_loss` takes the decoder's output states and
the output projection's weight instead, and computes projection and loss a chunk of target
tokens at a time (`ChunkedOutputLoss`), so that neither the (N, V) logits nor their fp32
log-probabilities exist for the whole batch: for 12,500 target tokens and 37k subwords the
fp32 log-probabilities alone are 1.85 GB, and autograd keeps them, and the logits, for the
backward pass. Its gradient is the same function's: with p = softmax(logits) and the
smoothed target q, d loss / d logits = p - q on real tokens (0 on padding).

`alignment_loss` is guided alignment's term (Garg et al. 2019, train.align_weight): the
cross-entropy between a statistical alignment, normalised over each target token's linked
source tokens, and the guided heads' encoder-decoder attention when predicting that token,
summed over aligned target tokens:

    loss_a = - sum_t sum_s G_ts log A_ts,   G_ts = 1 / |links of t| where t and s are linked

(A the mean of the guided heads' attention). It is weighted and added to the sum above, so it
is divided by the update's target tokens with it.
"""

from __future__ import annotations

import torch
from torch import Tensor

CHUNK_ELEMENTS = 1 << 25  # logits per chunk of output_loss: 128 MB in fp32


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


def chunked_loss_and_grads(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    target: Tensor,
    eps: float,
    pad_id: int,
    dtype: torch.dtype,
    chunk: int,
    need_grads: tuple[bool, bool, bool] = (False, False, False),
) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None, Tensor | None]:
    """(smoothed loss sum, NLL sum) of logits = hidden @ weight^T (+ bias), computed `chunk`
    rows at a time, and where `need_grads` asks, their gradients with respect to hidden,
    weight and bias.

    hidden (N, d), weight (V, d), bias (V,) or None, target (N,); products in `dtype`, the
    bias, softmax and sums in fp32 (or in fp64 for fp64 inputs)."""
    N, V = hidden.size(0), weight.size(0)
    w = weight.to(dtype)
    acc = torch.promote_types(dtype, torch.float32)
    b = None if bias is None else bias.to(acc)
    need_h, need_w, need_b = need_grads
    grad_h = torch.empty_like(hidden) if need_h else None
    grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_w else None
    grad_b = torch.zeros(V, dtype=acc, device=weight.device) if need_b else None
    loss = hidden.new_zeros((), dtype=acc)
    nll = hidden.new_zeros((), dtype=acc)
    for start in range(0, N, chunk):
        h = hidden[start : start + chunk].to(dtype)  # (n, d)
        t = target[start : start + chunk].unsqueeze(1)  # (n, 1)
        logits = (h @ w.t()).to(acc)
        if b is not None:
            logits = logits + b
        lprobs = torch.log_softmax(logits, dim=-1)  # (n, V)
        keep = t != pad_id  # (n, 1)
        chunk_nll = -lprobs.gather(1, t.clamp(min=0)).masked_fill(~keep, 0.0).sum()
        smooth = -lprobs.mean(dim=-1, keepdim=True).masked_fill(~keep, 0.0).sum()
        loss += (1.0 - eps) * chunk_nll + eps * smooth
        nll += chunk_nll
        if not (need_h or need_w or need_b):
            continue
        # p - q: softmax minus the smoothed target (1 - eps on y, eps / V everywhere)
        grad = lprobs.exp_().sub_(eps / V)  # in place of lprobs, which is not needed again
        grad.scatter_add_(1, t.clamp(min=0), grad.new_full(t.shape, eps - 1.0))
        grad = grad.masked_fill_(~keep, 0.0)  # (n, V)
        if need_b:
            grad_b += grad.sum(0)
        grad = grad.to(dtype)
        if need_h:
            grad_h[start : start + chunk] = grad @ w
        if need_w:
            grad_w += (grad.t() @ h).to(acc)
    return loss, nll, grad_h, grad_w, grad_b


class ChunkedOutputLoss(torch.autograd.Function):
    """`chunked_loss_and_grads` as an autograd function: the forward pass computes the
    gradients too, and the backward pass scales them by the loss's incoming gradient. Only
    d loss / d hidden (N x d) and d loss / d weight (V x d) are kept, far less than N x V."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, target, eps, pad_id, dtype, chunk):
        need = tuple(ctx.needs_input_grad[:3])
        args = (hidden, weight, bias, target, eps, pad_id, dtype, chunk, need)
        loss, nll, grad_h, grad_w, grad_b = chunked_loss_and_grads(*args)
        ctx.save_for_backward(grad_h, grad_w, grad_b)
        ctx.weight_dtype = weight.dtype
        ctx.bias_dtype = None if bias is None else bias.dtype
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss, _grad_nll):
        grad_h, grad_w, grad_b = ctx.saved_tensors
        dh = None if grad_h is None else grad_h * grad_loss.to(grad_h.dtype)
        dw = None if grad_w is None else (grad_w * grad_loss).to(ctx.weight_dtype)
        db = None if grad_b is None else (grad_b * grad_loss).to(ctx.bias_dtype)
        return dh, dw, db, None, None, None, None, None


def output_loss(
    hidden: Tensor,
    weight: Tensor,
    target: Tensor,
    eps: float,
    pad_id: int,
    bias: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """hidden (N, d) decoder output states, weight (V, d) the output projection and bias (V,)
    its bias or None, target (N,) -> (smoothed loss sum, NLL sum), as
    label_smoothed_nll(hidden @ weight^T + bias, ...) computes them, the products in
    autocast's dtype where it is on (else hidden's)."""
    device = hidden.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
    chunk = max(1, CHUNK_ELEMENTS // weight.size(0))
    args = (hidden, weight, bias, target, eps, pad_id, dtype, chunk)
    trained = hidden.requires_grad or weight.requires_grad
    trained = trained or (bias is not None and bias.requires_grad)
    with torch.autocast(device, enabled=False):
        if torch.is_grad_enabled() and trained:
            return ChunkedOutputLoss.apply(*args)
        return chunked_loss_and_grads(*args)[:2]  # validation: no gradients to compute


def alignment_loss(weights: Tensor, index: Tensor, link_weight: Tensor) -> Tensor:
    """weights (B, H, T, S) the guided heads' attention; index (K, 3) (row, target position,
    source position) of each piece link and link_weight (K,) its share of its target token
    (batching.py's `alignment_targets`) -> loss_a, summed (fp32)."""
    attention = weights.float().mean(1)  # (B, T, S)
    picked = attention[index[:, 0], index[:, 1], index[:, 2]]  # (K,)
    return -(link_weight * picked.clamp_min(1e-9).log()).sum()
