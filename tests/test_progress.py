"""Progress of long jobs (mtx/progress.py): plain lines, at most one every `every` seconds
and one at the end, where stderr is not a terminal."""

import io

from mtx.progress import Progress


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_log_file_gets_a_plain_line_every_interval_and_one_at_the_end():
    out, clock = io.StringIO(), Clock()
    with Progress(1000, "translated", "lines", initial=200, every=30, file=out, clock=clock) as p:
        for _ in range(8):  # 100 lines every 10 s
            clock.now += 10
            p.update(100)
    lines = out.getvalue().splitlines()
    assert lines == [
        "translated 500/1,000 lines (50%), 10.0 lines/s, 50 s left",
        "translated 800/1,000 lines (80%), 10.0 lines/s, 20 s left",
        "translated 1,000/1,000 lines (100%), 10.0 lines/s",
    ]
    assert "\r" not in out.getvalue()


def test_nothing_done_nothing_said():
    out = io.StringIO()
    with Progress(10, "translated", "lines", initial=10, file=out):
        pass
    assert out.getvalue() == ""
