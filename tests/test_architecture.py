"""The shape of the code, checked: dependencies run one way (no module imports upward or in a
circle, not even for typing), no function passes 60 lines, checkpoints are read and written in
one module only, and no code changes Python's import path."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Floors, bottom first. A module may import modules of a lower floor, and of its own group
# (never another group of its floor): the model knows no corpus, the data no model.
FLOORS = [
    {
        "base": [
            "mtx",
            "mtx.errors",
            "mtx.files",
            "mtx.tokens",
            "mtx.device",
            "mtx.progress",
            "mtx.distributed",
        ]
    },
    {
        "config": ["mtx.config", "mtx.corpora"],
        "align": ["mtx.align"],
        "documents": ["mtx.documents"],
    },
    {"checkpoint": ["mtx.checkpoint"]},
    {"model": ["mtx.model"], "data": ["mtx.data"], "evaluate": ["mtx.evaluate"]},
    {"decode": ["mtx.decode"]},
    {
        "train": ["mtx.train"],
        "formats": ["mtx.formats"],
        "info": ["mtx.info"],
        "jobs": ["mtx.jobs"],
    },
    {"serve": ["mtx.serve"], "plot": ["mtx.plot"]},
    {"bench": ["mtx.bench"]},
    {"cli": ["mtx.cli", "mtx.__main__"]},
    {"benchmarks": ["benchmarks"]},  # investigations in the checkout, not installed
]


def modules() -> dict[str, Path]:
    """Every module of mtx/ and benchmarks/, by dotted name."""
    out = {}
    for package in ("mtx", "benchmarks"):
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def place(module: str) -> tuple[int, str]:
    """(floor, group) of a module: the longest prefix that names it."""
    best = None
    for floor, groups in enumerate(FLOORS):
        for group, prefixes in groups.items():
            for prefix in prefixes:
                if module == prefix or module.startswith(prefix + "."):
                    if best is None or len(prefix) > best[2]:
                        best = (floor, group, len(prefix))
    assert best is not None, f"{module} is on no floor: add it to FLOORS"
    return best[0], best[1]


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules `name` imports, anywhere in it (in functions, under TYPE_CHECKING)."""
    found = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports(name, path, set(mods)) for name, path in mods.items()}


def test_no_module_imports_upward_or_across_its_floor():
    wrong = []
    for name, targets in graph().items():
        floor, group = place(name)
        for target in targets:
            t_floor, t_group = place(target)
            if t_floor > floor or (t_floor == floor and t_group != group):
                wrong.append(f"{name} ({group}) imports {target} ({t_group})")
    assert not wrong, "\n".join(wrong)


def test_no_module_imports_in_a_circle():
    edges = graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                return [*path, node, nxt]
            if nxt not in state and (cycle := visit(nxt, [*path, node])):
                return cycle
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state:
            cycle = visit(node, [])
            assert cycle is None, " -> ".join(cycle[cycle.index(cycle[-1]) :])


def functions(path: Path):
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


@pytest.mark.parametrize("name", sorted(modules()))
def test_no_function_passes_60_lines(name):
    path = modules()[name]
    long = [
        f"{path.relative_to(ROOT)}:{f.lineno} {f.name}: {f.end_lineno - f.lineno + 1} lines"
        for f in functions(path)
        if f.end_lineno - f.lineno + 1 > 60
    ]
    assert not long, "\n".join(long)


def test_no_function_passes_60_lines_once_formatted_without_fmt_skip(tmp_path):
    """`# fmt: skip` may keep an argument list on fewer lines, never a function under 60:
    every module formatted by ruff as if it had none keeps its functions under 60 lines."""
    copies = {}
    for name, path in modules().items():
        copies[name] = tmp_path / f"{name}.py"
        text = re.sub(r"\s*# fmt: (skip|off|on)\b", "", path.read_text())
        copies[name].write_text(text)
    ruff = Path(sys.executable).parent / "ruff"
    subprocess.run([ruff, "format", "--quiet", "--line-length", "100", tmp_path], check=True)
    long = [
        f"{modules()[name].relative_to(ROOT)}: {f.name}: {f.end_lineno - f.lineno + 1} lines"
        for name, copy in copies.items()
        for f in functions(copy)
        if f.end_lineno - f.lineno + 1 > 60
    ]
    assert not long, "\n".join(long)


def calls(path: Path, dotted: str) -> list[int]:
    """Lines where `path` calls `dotted` (e.g. torch.load) or passes weights_only=False."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            if ast.unparse(node.func) == dotted:
                lines.append(node.lineno)
            if any(
                k.arg == "weights_only" and ast.unparse(k.value) == "False" for k in node.keywords
            ):
                lines.append(node.lineno)
    return lines


def test_checkpoints_are_read_and_written_in_the_checkpoint_module_only():
    """Every other module reads a checkpoint's fields (mtx/checkpoint.py's Checkpoint), never
    its keys: only the checkpoint module calls torch.load and torch.save, always safely."""
    found = []
    for name, path in modules().items():
        if name == "mtx.checkpoint":
            continue
        for dotted in ("torch.load", "torch.save"):
            found += [f"{path.relative_to(ROOT)}:{n} {dotted}" for n in calls(path, dotted)]
    assert not found, "\n".join(found)
    assert calls(ROOT / "mtx" / "checkpoint.py", "torch.load")  # the one loader is there
    text = (ROOT / "mtx" / "checkpoint.py").read_text()
    assert "weights_only=True" in text and "weights_only=False" not in text


def test_no_code_changes_the_import_path():
    """Modules import each other as installed packages: no sys.path or PYTHONPATH changes in
    the package, the benchmarks, the tests or the scripts."""
    found = []
    for folder in ("mtx", "benchmarks", "tests", "scripts"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix not in (".py", ".sh") or path == Path(__file__):
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if "sys.path" in line or "syspath_prepend" in line or "PYTHONPATH=" in line:
                    found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    allowed = [f for f in found if f.startswith("scripts/gpu_report.sh")]  # pip --target there
    assert found == allowed, "\n".join(found)


# The benchmarks that read a run's metrics.jsonl (the file format) and report its figures.
METRICS_READERS = {"benchmarks.gpu_parts", "benchmarks.gpu_report", "benchmarks.per_update"}

# Protocols between modules that are types now: their string keys, and the one module where
# each may still be spelled (the file format it reads and writes), if any. Words that other
# formats use too ("src", a column of the prepared data; "sets", "kept") are left out.
PROTOCOL_KEYS = {
    "the decoder cache (mtx/model/cache.py)": (
        {"k", "v", "memory_k", "memory_v", "memory_states", "memory_keys", "position",
         "visible", "length", "feed", "h0", "c0"},
        set(),
    ),
    "the batch (mtx/data/batching.py's Batch, train/data.py's Streamed)": (
        {"tgt_in", "tgt_out", "tgt_index", "src_padded", "src_tokens", "tgt_tokens",
         "padded_tokens", "update_tokens", "after"},
        set(),
    ),
    "sacreBLEU's scores (mtx/evaluate.py's Scores)": ({"bleu_detail", "chrf_signature"}, set()),
    "a validation (mtx/train/validate.py's Validation; metrics.jsonl's valid records)": (
        {"valid_loss", "valid_nll", "valid_ppl", "valid_bleu", "valid_chrf", "valid_seconds",
         "bleu_seconds"},
        {"mtx.train.validate", *METRICS_READERS},
    ),
    "a log line (mtx/train/metrics.py's TrainRecord, train/compiled.py's Compilations)": (
        {"grad_norm", "compiled_graphs", "compile_seconds", "compilations"},
        {"mtx.train.compiled", "mtx.bench.train", *METRICS_READERS},
    ),
    "an attention record (mtx/decode/result.py's Attention)": (
        {"weights", "output", "alignment"},
        {"mtx.decode.result", "mtx.plot"},  # the server's answer; --attention-dir's files
    ),
    "the manifest (mtx/checkpoint.py's Manifest)": (
        {"splits", "spm_sha256", "spm_source", "pairs_sha256", "file_sha256"},
        {"mtx.checkpoint"},
    ),
}  # fmt: skip


def string_keys(path: Path):
    """(line, key) of every string used as a key: x["key"], {"key": ...}, x.get("key"),
    "key" in x."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        keys = []
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            keys = [node.slice.value]
        elif isinstance(node, ast.Dict):
            keys = [k.value for k in node.keys if isinstance(k, ast.Constant)]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("get", "pop", "setdefault")
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            keys = [node.args[0].value]
        elif isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant):
            if any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
                keys = [node.left.value]
        yield from ((node.lineno, key) for key in keys if isinstance(key, str))


def test_typed_protocols_are_read_by_field_not_by_string_key():
    """The decoder cache, batches and the manifest cross modules as types: no module spells
    their keys but the one that reads and writes their file format."""
    found = []
    for name, path in modules().items():
        keys = list(string_keys(path))
        for protocol, (spelled, homes) in PROTOCOL_KEYS.items():
            if name in homes:
                continue
            found += [
                f"{path.relative_to(ROOT)}:{n} {k!r}: {protocol}" for n, k in keys if k in spelled
            ]
    assert not found, "\n".join(found)
    assert any(k == "splits" for _, k in string_keys(ROOT / "mtx" / "checkpoint.py"))


# Words that name a member of one type: the one module where each may be spelled. A string
# that crosses a file boundary is a type waiting to be written (shared/STYLE.md, habit 20).
TYPED_WORDS = {
    "a document atom (mtx/documents/atoms.py's Kind)": (
        {"word", "space", "keep", "open", "close"}, {"mtx.documents.atoms"}
    ),
    "a corpus job's counter (mtx/jobs/shards.py's Counters)": (
        {"taken", "finished"}, {"mtx.jobs.shards"}
    ),
    "a distill work file's key (mtx/jobs/distill.py's Work)": (
        {"cross_entropy", "pick"}, {"mtx.jobs.distill"}
    ),
}  # fmt: skip


def test_no_string_literal_names_a_typed_member_outside_its_type():
    """Document atoms, a corpus job's counters and the distill work file's keys are spelled in
    their one module; everything else reads the type."""
    found = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Constant) or not isinstance(node.value, str):
                continue
            for what, (words, homes) in TYPED_WORDS.items():
                if node.value in words and name not in homes:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}: {what}")
    assert not found, "\n".join(found)
