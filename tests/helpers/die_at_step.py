"""`python die_at_step.py ARGS...` runs `mtx ARGS...` as a torchrun worker that SIGKILLs itself
just before update MTX_DIE_AT_STEP + 1 when it is rank MTX_DIE_RANK in torchrun's first
attempt: a worker that dies at a chosen step, with no race between a test and the job."""

import os
import signal
import sys

from mtx.cli import main
from mtx.train.trainer import Trainer

die_at, rank = int(os.environ["MTX_DIE_AT_STEP"]), int(os.environ["MTX_DIE_RANK"])
if int(os.environ["RANK"]) == rank and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
    update = Trainer.update

    def update_or_die(self, batches, ntokens):
        if self.state.step == die_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return update(self, batches, ntokens)

    Trainer.update = update_or_die

sys.argv = ["mtx", *sys.argv[1:]]
main()
