"""Training-step throughput through DeepSpeed on one device: tokens/s, model FLOPs utilisation (MFU) and peak memory
of dense, BlockBERT n=2 and n=3 at N=512 and 1024, with ZeRO-1 in fp16 and bf16 (issue #13's GPU targets: dense
bert-base bf16 MFU >= 45% on H100; BlockBERT n=2 step <= 0.78x and memory <= 0.70x of dense at N=1024).

What is timed is what the trainer runs: dropout 0.1 on hidden states and attention (the paper set-ups of
run_scripts/common.sh; with attention dropout ``auto`` picks block_gather, not flex, for the sparse variants), and
the engine's inputs made by pretrain.trainer.device_batch, as Trainer._to_device makes them (the all-ones attention
mask is dropped on the host, so dense runs unmasked SDPA, except when compiled: one input signature; the MLM head
gathers the derived max_predictions_per_seq).
Each row records the kernel auto picked. With --data-path PREFIX --vocab-file V the steps run on the data
pipeline's own batches (the sample mode, padding and masking the trainer reads: --sample-mode, default the paper
set-ups' doc-sentences), each step a new batch; tokens/s then counts real (unpadded) tokens. Without, the ids are
synthetic full rows with 15% labelled.

    python -m benchmarks.train_step_ds --model-preset bert-base --json out/train_step_ds.json          # on a GPU
    python -m benchmarks.train_step_ds --model-preset tiny --device cpu --precisions bf16 --steps 1      # smoke test
    python -m benchmarks.train_step_ds --data-path data/wiki_text_sentence --vocab-file vocab.txt ...  # real batches

FLOPs are counted by model/flops.py ("model FLOPs", the formula the trainer's log uses; here the MLM head's
predicted share is the batches' labelled share of positions), MFU against the dense fp16/bf16 tensor-core peak of
pretrain/throughput.py's table (a GPU not listed: MFU left empty). --compile compiles the engine as the trainer's
--compile does. Step time = the median of --steps timed
optimizer steps after --warmup ones, with the device synchronised around each.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from common.cli import add_deprecated_alias
from model.config import ModelConfig
from model.flops import layout_density, model_flops_per_token
from model.presets import PRESETS, blockbert
from pretrain.throughput import peak_tflops

TOKENS_PER_STEP = {"bert-base": 16384, "tiny": 256}
"""The model presets (model/presets.py) this benchmark sizes, and the b x N of a step for each."""
VARIANTS = {"dense": None, "blockbert-n2": 2, "blockbert-n3": 3, "modernbert-base": None, "modernbert-blockbert": 2}
"""Variant -> BlockBERT n (model.presets.blockbert, the paper's split scaled to the preset's heads); None = dense.
The variants of :data:`WHOLE_PRESETS` are their own models instead (the n is only what they use)."""
WHOLE_PRESETS = {"modernbert-base": "modernbert-base", "modernbert-blockbert": "modernbert-blockbert-base"}
"""Variant -> the model preset it trains as a whole (its widths, positions, layer plan and dropouts as the recipe has
them), whatever --model-preset sizes: issue #41's ModernBERT local/global layers with BlockBERT globals at 8192."""


def _init_single_rank() -> torch.device:
    from pretrain.distributed import init_distributed

    return init_distributed(10.0).device


def _pipeline_batches(args, seq_len: int, batch: int, n: int, mode: str) -> tuple[list[dict], int | None]:
    """``n`` host batches as the trainer's loader makes them, and the MLM cap it uses."""
    from data_pipeline.data_config import DataConfig
    from data_pipeline.loader import build_dataloader, build_datasets
    from data_pipeline.tokenization import build_tokenizer

    tok = build_tokenizer(args.tokenizer_type, vocab_file=args.vocab_file)
    cfg = DataConfig(data_path=[args.data_path], seq_length=seq_len, split="1,0,0", sample_mode=mode)
    train = build_datasets(cfg, tok, num_samples=(batch * n, 0, 0))[0]
    loader = build_dataloader(train, tok, cfg, micro_batch_size=batch, dp_rank=0, dp_world_size=1, num_workers=0)
    it = iter(loader)
    return [next(it) for _ in range(n)], cfg.max_predictions


@dataclass(frozen=True)
class Case:
    """One training step set-up: what train_step_ds measures and benchmarks/profile_step.py profiles."""

    variant: str = "dense"
    """A key of VARIANTS."""
    precision: str = "bf16"
    seq_len: int = 512
    batch: int | None = None
    """Micro-batch; None: --tokens // seq_len."""
    zero: int = 1
    """ZeRO stage of ds_configs/zero{stage}_{precision}.json."""
    ds_config: str | None = None
    """A file of ds_configs/ instead of zero{stage}_{precision}.json (its own stage and precision then apply)."""
    attention_dropout: float = 0.1
    """The paper set-ups' 0.1 (run_scripts/common.sh): with it ``auto`` trains the sparse variants with block_gather."""
    compile: bool = False
    """torch.compile through the engine, as the trainer's --compile (pretrain.parallelize.apply_compile)."""
    sample_mode: str | None = None
    """With --data-path: the trainer's --sample-mode (None: --sample-mode of the command line)."""


def case_model_config(case: Case, args) -> ModelConfig:
    """The model a case trains: --model-preset's sizes with the variant's BlockBERT layout, or a whole preset
    (:data:`WHOLE_PRESETS`); --kernel is the attention kernel either way."""
    blocks = VARIANTS[case.variant]
    sparsity = None if blocks is None else blockbert(blocks, args.heads, block=None)  # the layout's default tile
    if case.variant in WHOLE_PRESETS:
        name = WHOLE_PRESETS[case.variant]
        positions = max(ModelConfig.preset(name).max_position_embeddings, case.seq_len)
        attention = dict(PRESETS[name]["attention"], kernel=args.kernel)  # --kernel counts here too
        return ModelConfig.preset(
            name, vocab_size=args.vocab_size, max_position_embeddings=positions, attention=attention
        )
    return ModelConfig.preset(
        "bert-base",
        vocab_size=args.vocab_size,
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_attention_heads=args.heads,
        intermediate_size=4 * args.hidden,
        max_position_embeddings=max(512, case.seq_len),
        hidden_dropout=0.1,
        attention_dropout=case.attention_dropout,
        attention={"kernel": args.kernel, "sparsity": sparsity},
    )


class TrainStep:
    """A DeepSpeed engine over the model of a :class:`Case` and the inputs the trainer would give it (pretrain.trainer
    .device_batch, what Trainer._to_device calls: an all-ones mask dropped on the host, the static MLM gather with the
    derived cap). ``step()`` is one optimizer step on the next batch; ``close()`` frees the engine."""

    def __init__(self, case: Case, args, device: torch.device) -> None:
        from data_pipeline.masking import derived_max_predictions
        from model.bert import BertForPreTraining
        from pretrain.args import OptimConfig
        from pretrain.ds_config import apply_clip_grad, check_compile_supported, read_ds_config, resolve_batch_sizes
        from pretrain.parallelize import apply_compile, initialize_engine
        from pretrain.schedule import schedule_settings
        from pretrain.trainer import device_batch
        from tools.measure import synthetic_batch

        repo = Path(__file__).resolve().parents[1]
        self.case, self.device = case, device
        self.config = case_model_config(case, args)
        torch.manual_seed(0)
        model = BertForPreTraining(self.config)
        self.batch = case.batch or max(1, args.tokens // case.seq_len)
        ds = read_ds_config(repo / "ds_configs" / (case.ds_config or f"zero{case.zero}_{case.precision}.json"))
        check_compile_supported(ds, case.compile)
        resolve_batch_sizes(ds, self.batch, None, 1)
        optim = OptimConfig(lr=1e-4)
        apply_clip_grad(ds, optim.clip_grad)  # the trainer's --clip-grad default: DeepSpeed's clipping is in the step
        self.engine = initialize_engine(model, ds, optim, schedule_settings(1e-4, 0.0, 10, 1000, "linear"))
        self.clip = ds.clip_grad if ds.trainer_clips else None  # the trainer clips there (Trainer._before_update)
        if case.compile:
            apply_compile(self.engine, case.seq_len, device)
        if args.data_path:
            self.hosts, cap = _pipeline_batches(
                args, case.seq_len, self.batch, args.warmup + args.steps, case.sample_mode or args.sample_mode
            )
        else:
            self.hosts = [synthetic_batch(self.batch, case.seq_len, args.vocab_size, torch.device("cpu"))]
            cap = derived_max_predictions(case.seq_len, 0.15)
        self.feed = [device_batch(h, device, cap, keep_mask=case.compile) for h in self.hosts]
        self.density = layout_density(self.config, case.seq_len)
        self.predicted = float(sum((d["labels"] != -100).float().mean() for d in self.feed) / len(self.feed))
        self.real_tokens = [_real_tokens(h) for h in self.hosts]
        self.flops_per_token = model_flops_per_token(self.config, case.seq_len, self.predicted)
        self.calls = 0

    def step(self) -> None:
        from pretrain.parallelize import clip_gradients

        engine = self.engine
        data = self.feed[self.calls % len(self.feed)]
        self.calls += 1
        loss = engine(**data).loss
        engine.backward(loss)
        if self.clip is not None:
            clip_gradients(engine.module, self.clip)
        engine.step()

    def kernels_used(self) -> str:
        core = self.engine.module.bert.encoder.layers[0].attention.core
        used = sorted({k for plan in core._plans.values() for k in getattr(plan, "chosen", {}).values()})
        return ",".join(used)

    def close(self) -> None:
        """Free the engine and the batches before the next case."""
        self.engine = self.feed = None
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def _real_tokens(host: dict) -> int:
    """Real (unpadded) tokens of a host batch, as the trainer counts them."""
    return int(host["attention_mask"].sum()) if "attention_mask" in host else host["input_ids"].numel()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure(variant: str, precision: str, seq_len: int, args, device: torch.device) -> dict:
    ts = TrainStep(Case(variant, precision, seq_len, compile=args.compile), args, device)
    for _ in range(args.warmup):
        ts.step()
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for _ in range(args.steps):
        sync(device)
        t0 = time.perf_counter()
        ts.step()
        sync(device)
        times.append(time.perf_counter() - t0)
    step_s = statistics.median(times)
    tokens = statistics.mean(ts.real_tokens[args.warmup % len(ts.hosts) :] or ts.real_tokens)
    fpt = ts.flops_per_token
    peak = peak_tflops(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
    row = {
        "variant": variant,
        "precision": precision,
        "seq_len": seq_len,
        "batch": ts.batch,
        "compiled": args.compile,
        "density": ts.density,
        "step_s": step_s,
        "tokens_per_s": tokens / step_s,
        "tflops": fpt * tokens / step_s / 1e12,
        "mfu": (fpt * tokens / step_s / 1e12) / peak if peak else None,
        "peak_memory_mib": torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None,
        "kernel_requested": args.kernel,
        "kernel_used": ts.kernels_used() or args.kernel,
        "attention_mask_passed": any("attention_mask" in d for d in ts.feed),
        "batches": "data pipeline" if args.data_path else "synthetic",
        "max_predictions": ts.feed[0].get("max_predictions"),
    }
    ts.close()
    return row


def targets(rows: list[dict], device_name: str) -> list[dict]:
    """The issue's targets, each met / missed / not measured, with the numbers."""

    def find(v, p, n):
        return next((r for r in rows if (r["variant"], r["precision"], r["seq_len"]) == (v, p, n)), None)

    out = []
    dense = find("dense", "bf16", 1024) or find("dense", "fp16", 1024)
    d512 = find("dense", "bf16", 512)
    mfu = max((r["mfu"] for r in (d512, find("dense", "bf16", 1024)) if r and r["mfu"] is not None), default=None)
    out.append(
        {
            "target": "dense bert-base bf16 MFU >= 45% (H100)",
            "value": mfu,
            "met": None if mfu is None or "H100" not in device_name else mfu >= 0.45,
        }
    )
    n2 = find("blockbert-n2", dense["precision"], 1024) if dense else None
    for key, limit, label in (("step_s", 0.78, "step time"), ("peak_memory_mib", 0.70, "peak memory")):
        ratio = None
        if dense and n2 and dense.get(key) and n2.get(key):
            ratio = n2[key] / dense[key]
        out.append(
            {
                "target": f"BlockBERT n=2 {label} <= {limit}x dense at N=1024",
                "value": ratio,
                "met": None if ratio is None else ratio <= limit,
            }
        )
    return out


def comparisons(rows: list[dict]) -> list[dict]:
    """BlockBERT n=2 against dense at every (precision, N) where both were measured: step time and peak memory
    ratios (no target: the issue's targets are at N=1024, see :func:`targets`)."""
    ok = {(r["variant"], r["precision"], r["seq_len"]): r for r in rows if "error" not in r}
    out = []
    for (v, prec, n), n2 in sorted(ok.items(), key=lambda kv: (kv[0][1], kv[0][2])):
        dense = ok.get(("dense", prec, n))
        if v != "blockbert-n2" or dense is None:
            continue
        mem = None
        if n2.get("peak_memory_mib") and dense.get("peak_memory_mib"):
            mem = n2["peak_memory_mib"] / dense["peak_memory_mib"]
        out.append({"precision": prec, "seq_len": n, "step_ratio": n2["step_s"] / dense["step_s"], "memory_ratio": mem})
    return out


def parse_cases(specs: list[str]) -> list[tuple[str, int]]:
    """'dense@512' -> ('dense', 512); a clear error naming the bad one."""
    cases = []
    for spec in specs:
        variant, _, n = spec.partition("@")
        if variant not in VARIANTS or not n.isdigit():
            raise ValueError(f"--cases {spec!r}: write VARIANT@N with VARIANT one of {', '.join(VARIANTS)}")
        cases.append((variant, int(n)))
    return cases


def _write_json(path: str, result: dict) -> None:
    from common.errors import write_errors
    from common.outputs import atomic_file

    with write_errors(f"--json {path}", Path(path).parent), atomic_file(path) as tmp:
        tmp.write_text(json.dumps(result, indent=1))


def main(argv: list[str] | None = None) -> int:
    """The command line; bad input is one line and exit 2 (common.errors.run_entry)."""
    from common.errors import run_entry

    return run_entry("benchmarks.train_step_ds", _main, argv)


def _main(argv: list[str]) -> int:
    from common.outputs import check_file_writable
    from data_pipeline.indexed import IndexedDataset
    from data_pipeline.tokenization import build_tokenizer

    p = argparse.ArgumentParser(
        prog="python -m benchmarks.train_step_ds",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_deprecated_alias(
        p, p.add_argument("--model-preset", choices=sorted(TOKENS_PER_STEP), default="bert-base"), "--preset"
    )
    p.add_argument(
        "--variants",
        nargs="+",
        choices=list(VARIANTS),
        default=[v for v in VARIANTS if v not in WHOLE_PRESETS],
        help="default: the bert-base-sized ones (whole presets only when named)",
    )
    p.add_argument("--seq-lens", type=int, nargs="+", default=[512, 1024])
    p.add_argument(
        "--cases",
        nargs="+",
        metavar="VARIANT@N",
        help="measure exactly these (e.g. dense@512 dense@4096 blockbert-n2@4096) instead of --variants x --seq-lens",
    )
    p.add_argument(
        "--precisions",
        nargs="+",
        choices=["fp16", "bf16"],
        default=None,
        help="default: bf16 and fp16, fp16 only on GPUs below compute capability 8.0 (no bf16 hardware)",
    )
    p.add_argument("--kernel", default="auto", help="attention kernel of the sparse variants")
    add_deprecated_alias(p, p.add_argument("--vocab-size", type=int, default=30522), "--vocab")
    p.add_argument("--data-path", help="time the data pipeline's batches of this shard prefix (else synthetic ids)")
    p.add_argument("--vocab-file", help="with --data-path: the shard's WordPiece vocab")
    p.add_argument("--tokenizer-type", default="BertWordPieceLowerCase")
    p.add_argument("--sample-mode", default="doc-sentences", help="with --data-path: as the trainer's --sample-mode")
    p.add_argument("--tokens", type=int, help="b x N per step (default: the preset's)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--compile", action="store_true", help="torch.compile the engine as the trainer's --compile does")
    p.add_argument("--json", help="write the rows and the targets here")
    args = p.parse_args(argv)
    if args.data_path and not args.vocab_file:
        p.error("--data-path needs --vocab-file (the shard's vocabulary)")
    if args.data_path:  # before minutes of set-up: a missing shard or vocabulary is one line
        build_tokenizer(args.tokenizer_type, vocab_file=args.vocab_file)
        IndexedDataset(args.data_path)
    if args.json:
        check_file_writable(args.json, "--json")
    try:
        cases = parse_cases(args.cases) if args.cases else [(v, n) for n in args.seq_lens for v in args.variants]
    except ValueError as e:
        p.error(str(e))
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error(f"--device {args.device}: no CUDA GPU here (torch {torch.__version__}); use --device cpu")
    preset = PRESETS[args.model_preset]
    args.hidden, args.layers, args.heads = preset["hidden_size"], preset["num_layers"], preset["num_attention_heads"]
    args.tokens = args.tokens or TOKENS_PER_STEP[args.model_preset]
    if args.device == "cpu":
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    device = _init_single_rank()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    print(
        f"device {name}; torch {torch.__version__}; {args.model_preset}: hidden {args.hidden} x {args.layers} layers x "
        f"{args.heads} heads; b x N = {args.tokens}; ZeRO-1",
        flush=True,
    )
    rows = []
    if args.precisions is None:
        from pretrain.ds_config import gpus_support_bf16

        bf16 = args.device != "cuda" or gpus_support_bf16()
        args.precisions = ["bf16", "fp16"] if bf16 else ["fp16"]
        if not bf16:
            print("[train_step_ds] bf16 left out: a GPU below compute capability 8.0 has no bf16 hardware", flush=True)
    for precision in args.precisions:
        for v, n in cases:
            try:
                row = measure(v, precision, n, args, device)
            except Exception as e:  # record and go on: one failure must not hide the other numbers
                row = {"variant": v, "precision": precision, "seq_len": n, "error": f"{type(e).__name__}: {e}"}
            rows.append(row)
            if "error" in row:
                print(f"{precision} N={n} {v}: FAILED {row['error']}", flush=True)
            else:
                mfu = "n/a" if row["mfu"] is None else f"{100 * row['mfu']:.1f}%"
                mem = "n/a" if row["peak_memory_mib"] is None else f"{row['peak_memory_mib']:.0f} MiB"
                print(
                    f"{precision} N={n} {v:13s} b={row['batch']:3d} step {row['step_s'] * 1e3:8.1f} ms "
                    f"{row['tokens_per_s']:10.0f} tok/s {row['tflops']:7.1f} TFLOP/s MFU {mfu} peak {mem}",
                    flush=True,
                )
            if args.json:  # after every row: a run stopped at its time limit keeps what it measured
                _write_json(args.json, {"device": name, "preset": args.model_preset, "rows": rows, "complete": False})
    result = {
        "device": name,
        "preset": args.model_preset,
        "rows": rows,
        "targets": targets(rows, name),
        "comparisons": comparisons(rows),
        "complete": True,
    }
    for t in result["targets"]:
        verdict = "met" if t["met"] else "not measured" if t["met"] is None else "MISSED"
        print(f"target {t['target']}: {t['value']} -> {verdict}")
    for c in result["comparisons"]:
        mem = "n/a" if c["memory_ratio"] is None else f"{c['memory_ratio']:.2f}x"
        print(
            f"BlockBERT n=2 / dense at N={c['seq_len']} ({c['precision']}): step {c['step_ratio']:.2f}x, memory {mem}"
        )
    if args.json:
        _write_json(args.json, result)
    from pretrain.distributed import destroy_distributed

    destroy_distributed()
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
