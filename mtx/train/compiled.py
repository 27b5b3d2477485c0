"""`train.compile`: the training step's forward pass and loss through torch.compile, safely.

- `auto` (the default) compiles on CUDA devices and not elsewhere (on a 2-core CPU the
  compiled step was slower; on an H100 base's compiled step ran faster than eager, its losses
  following eager's: BENCHMARKS.md has the figures); `true` and `false` force it. Compiling costs a run's first
  minutes, so short runs of small models stay eager (configs/multi30k.yaml).
- What is compiled is the step's LossModel (step.py), DDP-wrapped under torchrun, with
  dynamic shapes: one graph serves every batch shape, and the bounded lengths of
  data/batching.py keep the kernels' plans reused. Every source is masked when compiled
  (eager skips the mask of a batch without padding), so that padded and unpadded batches
  do not compile a graph each. With `train.static_shapes`, batches take one of a fixed set
  of shapes (one per padded length, the loss over every position: nothing of a batch's
  shape depends on its contents) and torch.compile's automatic dynamic shapes are used:
  the first shape compiles specialised, the second once more with the sizes that changed
  left symbolic, and that graph serves every later shape. With
  `train.compile_mode: reduce-overhead`, each shape then runs as a CUDA graph of its own,
  recorded the first time the shape comes (a capture, not a compilation: milliseconds),
  which free-shaped batches could not use (their number of target tokens, a size of the
  loss, changes at almost every batch, and a graph is recorded per size).
- A compile error, at the first step or at any later recompile, never ends a run: the
  step is run again in eager mode, one warning line says why, and the run stays eager.
- `stats()` counts what was compiled (graphs, compilations, seconds) for metrics.jsonl and
  the progress line: after the first pass over an epoch's shapes, compilations must stop
  growing (tests/test_compiled.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

MODES = ("auto", "true", "false")


def wanted(setting: str, device: torch.device) -> bool:
    """Whether `train.compile` (auto, true or false) compiles on `device`."""
    return setting == "true" or (setting == "auto" and device.type == "cuda")


def compile_errors() -> tuple[type[BaseException], ...]:
    """The exceptions by which torch.compile says it could not compile (not the model's own
    errors, which a compiled step raises as the eager step would)."""
    import torch._dynamo.exc
    import torch._inductor.exc

    return (torch._dynamo.exc.TorchDynamoException, torch._inductor.exc.InductorError)


@dataclasses.dataclass(frozen=True)
class Compilations:
    """What torch.compile did in this process so far: graphs compiled, compilations (the
    first of each frame and every recompile) and the seconds spent compiling."""

    graphs: int
    compilations: int
    seconds: float

    def record(self) -> dict:
        """The metrics.jsonl keys."""
        return {
            "compiled_graphs": self.graphs,
            "compilations": self.compilations,
            "compile_seconds": self.seconds,
        }


def stats() -> Compilations:
    """What was compiled in this process so far."""
    from torch._dynamo.utils import compilation_time_metrics, counters

    return Compilations(
        graphs=counters["stats"]["unique_graphs"],
        compilations=counters["frames"]["ok"],
        seconds=sum(compilation_time_metrics.get("_compile.compile_inner", [])),
    )


class StepModule:
    """The module the training step runs: `module` (a LossModel, or DDP around one) compiled
    when `enabled`, until compiling fails; then `module` itself."""

    def __init__(
        self,
        module: torch.nn.Module,
        enabled: bool,
        warn: Callable[[str], None] = print,
        backend: str | Callable = "inductor",
        mode: str = "default",
        static: bool = False,
    ) -> None:
        self.eager = module
        self.loss_model = getattr(module, "module", module)  # inside DDP
        self.warn = warn
        self.compiled = None
        if enabled:
            self.loss_model.chunked = False  # whole logits: the compiler fuses the loss
            self.loss_model.mask_always = True  # one graph for padded and unpadded batches
            options = {"mode": mode} if backend == "inductor" else {}
            # static shapes: automatic dynamic shapes (None); else every size symbolic (True)
            dynamic = None if static else True
            self.compiled = torch.compile(module, dynamic=dynamic, backend=backend, **options)
        self.graphs = mode == "reduce-overhead" and backend == "inductor"

    @property
    def is_compiled(self) -> bool:
        return self.compiled is not None

    def run(self, step: Callable[[torch.nn.Module], dict], optimizer) -> dict:
        """step(module), with the compiled module while it compiles, else in eager mode. A step
        that failed to compile is run again from the start, in eager mode."""
        if self.compiled is None:
            return step(self.eager)
        try:
            if self.graphs:  # a new step: CUDA graphs' outputs of the last one may be reused
                torch.compiler.cudagraph_mark_step_begin()
            return step(self.compiled)
        except compile_errors() as e:
            self.warn(f"warning: train.compile failed, training goes on in eager mode ({why(e)})")
            self.compiled = None
            self.loss_model.chunked = True
            self.loss_model.mask_always = False
            optimizer.zero_grad(set_to_none=True)  # the failed step's partial gradients
        return step(self.eager)


def why(error: BaseException) -> str:
    """One line: the error under torch.compile's wrapping of it."""
    cause = getattr(error, "inner_exception", None) or error.__cause__ or error
    lines = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {lines[0]}" if lines else type(cause).__name__
