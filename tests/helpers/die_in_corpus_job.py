"""`python die_in_corpus_job.py ARGS...` runs `mtx ARGS...` as a torchrun worker of a corpus job
(mtx/jobs/shards.py) where, in torchrun's first attempt, rank 1 writes its first chunk, then half
of another chunk's text (a tail no index line names), and SIGKILLs itself; rank 0 takes its first
chunk only once rank 1 has taken one. So the job always dies with a whole block and a torn tail
on rank 1's disk, with no race between a test and the job."""

import os
import signal
import sys
import time

from mtx.cli import main
from mtx.jobs import shards

rank = int(os.environ["RANK"])
if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
    add, take = shards.Part.add, shards.Counters.take

    def add_and_die(self, first, texts):
        lines = add(self, first, texts)
        data = "".join(texts).encode("utf-8")
        self._write(self.text, data[: len(data) // 2])
        os.kill(os.getpid(), signal.SIGKILL)
        return lines

    def take_after_rank_1(self):
        if not getattr(self, "waited", False):
            while self._add(self.TAKEN, 0) < 1:  # rank 1 has not taken its first chunk yet
                time.sleep(0.01)
            self.waited = True
        return take(self)

    if rank == 1:
        shards.Part.add = add_and_die
    else:
        shards.Counters.take = take_after_rank_1

sys.argv = ["mtx", *sys.argv[1:]]
main()
