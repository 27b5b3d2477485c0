"""`python busy_heartbeat.py ARGS...` runs `mtx ARGS...` with the heartbeat beating every
millisecond instead of every second, so that the heartbeat thread is almost always inside a
store call when the job ends: the moment at which a thread left running at exit aborted a
finished job ("terminate called without an active exception")."""

import sys

from mtx import distributed
from mtx.cli import main

distributed.BEAT_S = 0.001

sys.argv = ["mtx", *sys.argv[1:]]
main()
