"""The `mtx` command line. Each command parses its options, loads the config and calls one
function: data.py (`fetch`, `prepare`, `toy`), aligning.py (`mtx align ...`), training.py (`train`, `average`, `info`, `plot`,
`export`, `import`), decoding.py (`translate`, `evaluate`, `serve`), scoring.py (`score`, `distill`,
`shortlist`), bench.py
(`mtx bench ...`). The app and what they share are in app.py; the commands are registered
here, in the order `mtx --help` lists them.
"""

from mtx.cli import aligning, bench, data, decoding, scoring, training
from mtx.cli.app import app
from mtx.cli.decoding import read_lines

__all__ = ["app", "main", "read_lines"]

for command in (
    data.fetch,
    data.prepare,
    training.train,
    decoding.serve,
    decoding.translate,
    decoding.evaluate,
    scoring.score,
    scoring.distill,
    scoring.shortlist,
    training.info,
    training.plot,
    training.export,
    training.average,
):
    app.command()(command)
app.command("import")(training.import_)
app.add_typer(aligning.align_app, name="align")
app.add_typer(bench.bench_app, name="bench")
app.command()(data.toy)


def main() -> None:
    app(prog_name="mtx")  # `python -m mtx` too shows `mtx` in its usage lines
