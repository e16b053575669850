"""The command line of the training-step harness: ``python -m benchmarks.step --measure M [M's flags]``, one parser
per measure built from the flags they share (written once here), the set-up they share (device, process group,
output checks) and one JSON envelope (benchmarks/report.py).

    python -m benchmarks.step --measure time --model-preset bert-base --json out/step_time.json            # on a GPU
    python -m benchmarks.step --measure time --cases dense,blockbert-n2@512,4096 --json out/step_time.json  # 4 cases
    python -m benchmarks.step --measure time --model-preset tiny --device cpu --precisions bf16 --steps 1   # smoke
    python -m benchmarks.step --measure time --data-path data/wiki_text_sentence --vocab-file vocab.txt    # real rows
    python -m benchmarks.step --measure profile --data-path D/sample_text_sentence --vocab-file D/vocab.txt
    python -m benchmarks.step --measure profile --model-preset tiny --device cpu --seq-len 64 --batch 2 --variants eager
    python -m benchmarks.step --measure memory --model-preset bert-base --cases dense@4096 blockbert-n2@4096
    python -m benchmarks.step --measure memory --model-preset tiny --device cpu --cases dense@128 blockbert-n2@128
    python -m benchmarks.step --measure host --json host.json
    python -m benchmarks.step --measure host --configs zero1_bf16.json zero1_bf16_overlap.json --hidden 768

``python -m benchmarks.step --measure M --help`` lists M's flags and says what it measures.
"""

from __future__ import annotations

import argparse
import os
import platform
from pathlib import Path

import torch

from benchmarks.report import commit_info, write_json
from benchmarks.step import host, memory, profiling, timing
from benchmarks.step.case import CASES, DEFAULT_CASES, TOKENS_PER_STEP, preset_shape

MEASURES = {"time": timing, "profile": profiling, "memory": memory, "host": host}
"""--measure -> the module that measures it (its docstring is its --help)."""
REPO = Path(__file__).resolve().parents[2]


def _model_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model-preset", choices=sorted(TOKENS_PER_STEP), default="bert-base")
    p.add_argument(
        "--kernel", default="auto", help="attention kernel of the sparse variants (dense always runs auto's dense path)"
    )
    p.add_argument("--vocab-size", type=int, default=30522)


def _data_flags(p: argparse.ArgumentParser, sample_mode: str, sample_help: str) -> None:
    p.add_argument("--data-path", help="the trainer's batches of this shard prefix (else synthetic ids)")
    p.add_argument("--vocab-file", help="with --data-path: the shard's WordPiece vocab")
    p.add_argument("--tokenizer-type", default="BertWordPieceLowerCase")
    p.add_argument("--sample-mode", default=sample_mode, help=sample_help)


def _steps_flags(p: argparse.ArgumentParser, warmup: int, steps: int | None, steps_help: str = "timed steps") -> None:
    p.add_argument("--warmup", type=int, default=warmup)
    if steps is not None:
        p.add_argument("--steps", type=int, default=steps, help=steps_help)


def _output_flags(p: argparse.ArgumentParser, device: bool, json_help: str) -> None:
    if device:
        p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--json", help=json_help)


def _time_flags(p: argparse.ArgumentParser) -> None:
    _model_flags(p)
    p.add_argument(
        "--cases",
        **CASES.flag(
            DEFAULT_CASES["time"],
            'the model variants to time, each at its N (docs/benchmarks.md, "Cases"); a set\'s name (long: dense, '
            "n=2, n=3 and window-b64 at N=16384 and 32768) stands for its cases",
        ),
    )
    p.add_argument(
        "--precisions",
        nargs="+",
        choices=["fp16", "bf16"],
        default=None,
        help="default: bf16 and fp16, fp16 only on GPUs below compute capability 8.0 (no bf16 hardware)",
    )
    _data_flags(p, "doc-sentences", "with --data-path: as the trainer's --sample-mode")
    p.add_argument("--tokens", type=int, help="b x N per step (default: the preset's)")
    _steps_flags(p, 3, 10)
    p.add_argument("--compile", action="store_true", help="torch.compile the engine as the trainer's --compile does")
    _output_flags(p, True, "write the rows and the targets here (after every row)")


def _profile_flags(p: argparse.ArgumentParser) -> None:
    _model_flags(p)
    p.add_argument(
        "--variants", nargs="+", choices=list(profiling.STEP_VARIANTS), default=list(profiling.STEP_VARIANTS)
    )
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--batch", type=int, default=32, help="micro-batch of the base case (batch_x2/x4 multiply it)")
    p.add_argument("--precision", choices=["fp16", "bf16"], default="bf16")
    _data_flags(
        p,
        "full-sentences",
        "rows of the base case: full-sentences (gpu_check's train_step: rows filled, few padded) or doc-sentences "
        "(the paper set-ups'; on the sample corpus 70%% padding at N=512)",
    )
    _steps_flags(p, 3, 2, "profiled steps per variant")
    p.add_argument(
        "--compile-estimate-s",
        type=float,
        default=60.0,
        help="the least time the compiled variant is started with (compiling bert-base takes about a minute)",
    )
    p.add_argument("--budget-s", type=float, help="stop starting variants when this is spent (see the description)")
    _output_flags(p, True, "write the rows here (after every variant)")
    p.add_argument("--trace", help="the first variant's chrome trace (.json, or .json.gz)")


def _memory_flags(p: argparse.ArgumentParser) -> None:
    _model_flags(p)
    p.add_argument("--cases", **CASES.flag(DEFAULT_CASES["memory"], "the model variants whose peak to break down"))
    p.add_argument("--precision", choices=["fp16", "bf16"], default="bf16")
    p.add_argument("--zero", type=int, choices=[0, 1, 2], default=1, help="ZeRO stage of ds_configs/zero{S}_{P}.json")
    p.add_argument("--tokens", type=int, help="b x N per step (default: the preset's)")
    _steps_flags(p, 2, None)
    p.add_argument("--top", type=int, default=12, help="how many (category, op, frame) groups to list per case")
    _output_flags(p, True, "write the rows here (after every case)")


def _host_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--configs", nargs="+", default=list(host.CONFIGS), help="ds_configs/ files (bf16) to compare")
    p.add_argument("--hidden", type=int, default=64, help="width of the bert-base layout (768: bert-base itself)")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--vocab-size", type=int, default=1024)
    p.add_argument("--seq-len", type=int, default=16)
    p.add_argument("--batch", type=int, default=1)
    _steps_flags(p, 2, 5)
    p.add_argument("--top", type=int, default=8, help="the most frequent operators listed per phase in the JSON")
    _output_flags(p, False, "write the rows here")


FLAGS = {"time": _time_flags, "profile": _profile_flags, "memory": _memory_flags, "host": _host_flags}


def build_parser(measure: str | None) -> argparse.ArgumentParser:
    """The parser of ``--measure measure`` (None: --measure alone, whose --help lists the measures)."""
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.step",
        description=(MEASURES[measure].__doc__ if measure else "") + "\n" + __doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--measure", choices=list(MEASURES), required=True, help="what to measure of the training step")
    if measure:
        FLAGS[measure](p.add_argument_group(f"--measure {measure}"))
    return p


def _check(measure: str, args, p: argparse.ArgumentParser) -> list[tuple[str, int]]:
    """Bad input refused before minutes of set-up, each one line naming the flag; the cases to run (time, memory)."""
    from common.outputs import check_file_writable

    for f, flag in ((args.json, "--json"), (getattr(args, "trace", None), "--trace")):
        if f:
            check_file_writable(f, flag)
    if getattr(args, "data_path", None):
        if not args.vocab_file:
            p.error("--data-path needs --vocab-file (the shard's vocabulary)")
        from data_pipeline.indexed import IndexedDataset
        from data_pipeline.tokenization import build_tokenizer

        build_tokenizer(args.tokenizer_type, vocab_file=args.vocab_file)
        IndexedDataset(args.data_path)
    packed = [v for v in getattr(args, "variants", []) if profiling.STEP_VARIANTS.get(v, {}).get("sample_mode")]
    if measure == "profile" and packed and not args.data_path:
        p.error(f"--variants {' '.join(packed)} needs --data-path (packed rows come from the data pipeline)")
    if measure == "host":
        for c in args.configs:
            if not (REPO / "ds_configs" / c).is_file():
                p.error(f"--configs {c}: no such file in {REPO / 'ds_configs'}")
    device = getattr(args, "device", "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        p.error(f"--device {device}: no CUDA GPU here (torch {torch.__version__}); use --device cpu")
    return args.cases if measure in ("time", "memory") else []


def _shape(measure: str, args) -> None:
    """What a measure's flags leave implied: the model's shape and b x N (TrainStep reads them from ``args``)."""
    if measure == "host":  # bert-base's layout at --hidden's width, on CPU, synthetic rows
        args.heads, args.kernel, args.data_path, args.device = max(1, args.hidden // 64), "auto", None, "cpu"
        args.tokens = args.batch * args.seq_len
        return
    preset_shape(args)
    if measure == "profile":
        args.tokens, args.compile = args.batch * args.seq_len, False
    else:
        args.tokens = args.tokens or TOKENS_PER_STEP[args.model_preset]
    if measure == "memory":
        args.data_path, args.steps = None, 0  # synthetic full rows: the memory question does not depend on the text
    if measure == "time" and args.precisions is None:
        from pretrain.ds_config import gpus_support_bf16

        bf16 = args.device != "cuda" or gpus_support_bf16()
        args.precisions = ["bf16", "fp16"] if bf16 else ["fp16"]
        if not bf16:
            print("[step time] bf16 left out: a GPU below compute capability 8.0 has no bf16 hardware", flush=True)


def main(argv: list[str] | None = None) -> int:
    """The command line; bad input is one line and exit 2 (common.error_exit.run_entry)."""
    from common.error_exit import run_entry

    return run_entry("benchmarks.step", _main, argv)


def _main(argv: list[str]) -> int:
    first = argparse.ArgumentParser(prog="python -m benchmarks.step", add_help=False)
    first.add_argument("--measure", choices=list(MEASURES))
    measure = first.parse_known_args(argv)[0].measure
    p = build_parser(measure)
    args = p.parse_args(argv)
    cases = _check(measure, args, p)
    _shape(measure, args)
    if args.device == "cpu":
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    from benchmarks.step.engine import init_single_rank

    device = init_single_rank()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    commit, _ = commit_info()
    envelope = {"measure": measure, "commit": commit, "args": dict(vars(args))}

    def write(result: dict) -> None:
        if args.json:
            write_json(args.json, envelope | result)

    print(f"[step {measure}] device {name}; torch {torch.__version__}; {_model_line(measure, args)}", flush=True)
    if measure == "time":
        result = timing.run(args, cases, device, name, write)
    elif measure == "profile":
        result = profiling.run(args, device, name, write)
    elif measure == "memory":
        result = memory.run(args, cases, device, name, write)
    else:
        result = host.run(args, device, write)
    write(result)
    print("\n".join(MEASURES[measure].markdown(result)), flush=True)
    from pretrain.distributed import destroy_distributed

    destroy_distributed()
    return 1 if any("error" in r for r in result["rows"]) else 0


def _model_line(measure: str, args) -> str:
    shape = f"hidden {args.hidden} x {args.layers} layers x {args.heads} heads"
    if measure == "host":
        return f"bert-base layout at {shape}; b x N = {args.tokens}"
    return f"{args.model_preset}: {shape}; b x N = {args.tokens}"
