import pytest
import torch
import torch.nn.functional as F

from mtx.train import loss as loss_module
from mtx.train.loss import label_smoothed_nll, output_loss


def test_loss_equals_torch_cross_entropy_with_label_smoothing():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11)
    target = torch.randint(1, 11, (3, 5))
    target[1, 3:] = 0  # padding
    target[2, 1:] = 0
    loss, nll = label_smoothed_nll(logits, target, eps=0.1, pad_id=0)
    want = F.cross_entropy(
        logits.view(-1, 11), target.view(-1), label_smoothing=0.1, ignore_index=0, reduction="sum"
    )
    torch.testing.assert_close(loss, want)
    want_nll = F.cross_entropy(
        logits.view(-1, 11), target.view(-1), ignore_index=0, reduction="sum"
    )
    torch.testing.assert_close(nll, want_nll)


def test_eps_zero_is_plain_nll_and_padding_is_ignored():
    logits = torch.randn(4, 7)
    target = torch.tensor([3, 0, 5, 0])
    loss, nll = label_smoothed_nll(logits, target, eps=0.0, pad_id=0)
    torch.testing.assert_close(loss, nll)
    loss_unpadded, _ = label_smoothed_nll(logits[[0, 2]], target[[0, 2]], eps=0.0, pad_id=0)
    torch.testing.assert_close(loss, loss_unpadded)


@pytest.mark.parametrize("chunk_rows", [1, 7, 64])
def test_the_chunked_output_loss_has_the_value_and_gradient_of_the_whole_one(
    chunk_rows, monkeypatch
):
    """output_loss (projection and loss a chunk of rows at a time, its gradient computed in the
    forward pass) against label_smoothed_nll on the whole logits, in float64: equal to
    rounding, for chunks of 1 row, of rows that do not divide N, and of all rows at once."""
    monkeypatch.setattr(loss_module, "CHUNK_ELEMENTS", chunk_rows * 50)  # V = 50
    torch.manual_seed(0)
    hidden = torch.randn(37, 16, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(50, 16, dtype=torch.float64, requires_grad=True)
    target = torch.randint(1, 50, (37,))
    target[[3, 10, 11, 36]] = 0  # padding
    for eps in (0.1, 0.0):
        loss, nll = output_loss(hidden, weight, target, eps, pad_id=0)
        (loss * 3.0).backward()  # an incoming gradient other than 1
        got = hidden.grad.clone(), weight.grad.clone()
        hidden.grad = weight.grad = None
        logits = hidden @ weight.T  # float64 throughout (label_smoothed_nll rounds to float32)
        want_loss = F.cross_entropy(
            logits, target, ignore_index=0, label_smoothing=eps, reduction="sum"
        )
        want_nll = F.cross_entropy(logits, target, ignore_index=0, reduction="sum")
        (want_loss * 3.0).backward()
        torch.testing.assert_close(loss, want_loss, rtol=1e-12, atol=0)
        torch.testing.assert_close(nll, want_nll, rtol=1e-12, atol=0)
        torch.testing.assert_close(got[0], hidden.grad, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(got[1], weight.grad, rtol=1e-10, atol=1e-12)
        hidden.grad = weight.grad = None
        assert not nll.requires_grad
    with torch.no_grad():  # validation: the value alone, no gradient computed
        loss, _ = output_loss(hidden, weight, target, 0.0, pad_id=0)
    torch.testing.assert_close(loss, want_loss.detach(), rtol=1e-12, atol=0)


def test_the_chunked_output_loss_computes_in_autocasts_dtype():
    torch.manual_seed(0)
    hidden = torch.randn(20, 16, requires_grad=True)
    weight = torch.randn(30, 16, requires_grad=True)
    target = torch.randint(1, 30, (20,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _ = output_loss(hidden, weight, target, 0.1, 0)
    loss.backward()
    assert loss.dtype == torch.float32 and weight.grad.dtype == torch.float32
    bf16 = hidden.detach().bfloat16().float() @ weight.detach().bfloat16().float().T
    want, _ = label_smoothed_nll(bf16, target, 0.1, 0)  # the bf16-rounded product
    torch.testing.assert_close(loss, want, rtol=1e-2, atol=0)


@pytest.mark.parametrize("chunk_rows", [1, 7, 64])
def test_the_chunked_output_loss_with_a_bias_has_the_value_and_gradients_of_the_whole_one(
    chunk_rows, monkeypatch
):
    """With model.output_bias the logits are hidden @ weight^T + bias: the chunked loss's
    value and its three gradients (hidden, weight, bias) are the whole logits', in float64."""
    monkeypatch.setattr(loss_module, "CHUNK_ELEMENTS", chunk_rows * 50)  # V = 50
    torch.manual_seed(0)
    hidden = torch.randn(37, 16, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(50, 16, dtype=torch.float64, requires_grad=True)
    bias = (torch.randn(50, dtype=torch.float64) * 3).requires_grad_()
    target = torch.randint(1, 50, (37,))
    target[[3, 10, 11, 36]] = 0  # padding
    loss, nll = output_loss(hidden, weight, target, 0.1, 0, bias)
    (loss * 3.0).backward()
    got = hidden.grad.clone(), weight.grad.clone(), bias.grad.clone()
    hidden.grad = weight.grad = bias.grad = None
    logits = hidden @ weight.T + bias
    want = F.cross_entropy(logits, target, ignore_index=0, label_smoothing=0.1, reduction="sum")
    (want * 3.0).backward()
    torch.testing.assert_close(loss, want, rtol=1e-12, atol=0)
    for mine, theirs in zip(got, (hidden.grad, weight.grad, bias.grad)):
        torch.testing.assert_close(mine, theirs, rtol=1e-10, atol=1e-12)
    assert bias.grad.abs().max() > 0.1  # the bias is trained
    unbiased, _ = output_loss(hidden, weight, target, 0.1, 0)
    assert not torch.isclose(unbiased, loss)
