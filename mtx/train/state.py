"""The run's position as training moves it: a checkpoint's `Position`, with the bookkeeping of
validations (the best so far by train.best_metric, and train.patience's count)."""

from __future__ import annotations

import dataclasses

from mtx.checkpoint import Position
from mtx.train.validate import SetScores


class TrainState(Position):
    """Where the run stands (step, data position, best validation); saved in every checkpoint
    through `state_dict` and restored by `load_state_dict`."""

    def observe(self, result: SetScores, metric: str) -> bool:
        """Note a validation's summary; True if it is the best yet by `metric` (loss: the
        lowest loss; bleu: the highest BLEU; a validation without BLEU does not count for
        bleu)."""
        better = {"loss": result.loss < self.best_valid_loss}
        self.best_valid_loss = min(self.best_valid_loss, result.loss)
        if result.bleu is not None:
            better["bleu"] = result.bleu > self.best_valid_bleu
            self.best_valid_bleu = max(self.best_valid_bleu, result.bleu)
        if metric not in better:
            return False
        if better[metric]:
            self.best_step, self.stale = self.step, 0
        else:
            self.stale += 1
        return better[metric]

    def out_of_patience(self, patience: int) -> bool:
        """`patience` validations in a row did not improve the best metric (0: never)."""
        return 0 < patience <= self.stale

    def state_dict(self) -> Position:
        return Position(**dataclasses.asdict(self))

    def load_state_dict(self, position: Position) -> None:
        for f in dataclasses.fields(Position):
            setattr(self, f.name, getattr(position, f.name))
