"""`train.ema`: an exponential moving average of the weights (Marian's exponential smoothing).

After every update, each parameter's average moves towards it:

    ema <- decay * ema + (1 - decay) * theta

with one `torch._foreach_lerp_` over all parameters, on the device, in float32: nothing waits
for the host. The average starts as the weights it is created with (a new run's first weights,
a fine-tuning run's loaded ones). Validation, best.pt and the weights of every checkpoint are
the average's (`swapped` puts it in the model for as long as it is needed); a resumable
checkpoint keeps the raw weights beside it (resume.py's StatefulParts), so a resumed run
continues both exactly.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


class Ema:
    def __init__(self, model: torch.nn.Module, decay: float) -> None:
        self.decay = decay
        self.names = [name for name, p in model.named_parameters() if p.requires_grad]
        params = dict(model.named_parameters())
        self.average = [params[n].detach().float().clone() for n in self.names]

    def trained(self, model: torch.nn.Module) -> list[torch.Tensor]:
        params = dict(model.named_parameters())
        return [params[n] for n in self.names]

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        """One update's step of the average towards `model`'s weights (device work only)."""
        weights = [p.detach().float() for p in self.trained(model)]
        torch._foreach_lerp_(self.average, weights, 1.0 - self.decay)

    def weights(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """`model`'s state_dict with the average in place of the trained parameters."""
        state = model.state_dict()
        for name, avg in zip(self.names, self.average):
            state[name] = avg.to(state[name].dtype).clone()
        return state

    def state_dict(self) -> dict[str, torch.Tensor]:
        return dict(zip(self.names, (a.clone() for a in self.average)))

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        for name, avg in zip(self.names, self.average):
            avg.copy_(state[name])

    @contextmanager
    @torch.no_grad()
    def swapped(self, model: torch.nn.Module) -> Iterator[None]:
        """`model` holding the average for the time of the block, its own weights after."""
        params = self.trained(model)
        raw = [p.detach().clone() for p in params]
        for p, avg in zip(params, self.average):
            p.copy_(avg)
        try:
            yield
        finally:
            for p, r in zip(params, raw):
                p.copy_(r)
