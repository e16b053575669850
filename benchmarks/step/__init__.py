"""One training-step harness, four measures (``python -m benchmarks.step --measure M``): the step the trainer runs
(DeepSpeed's engine over our model, the trainer's inputs) built once by :class:`benchmarks.step.engine.TrainStep`
for a :class:`benchmarks.step.case.Case`, then

- ``time`` (timing.py): tokens/s, TFLOP/s, MFU and peak memory of model variants at sequence lengths (issue #13);
- ``profile`` (profiling.py): torch.profiler's top kernels, busy fraction and host syncs of step variants;
- ``memory`` (memory.py): what the peak memory holds, by category and by the op that made it (issue #41);
- ``host`` (host.py): the host's aten operators per phase of the step, per bf16 DeepSpeed config, on CPU.

Flags live in cli.py (one parser per measure, the shared ones written once); every measure writes its JSON with
benchmarks/report.py's write_json and its table with markdown_table."""

from benchmarks.step.cli import main

__all__ = ["main"]
