import torch
import torch.nn.functional as F

from mtx.train.loss import label_smoothed_nll


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
