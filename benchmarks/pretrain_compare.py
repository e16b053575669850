"""Pretrain several attention set-ups on the same data, seed, batches and steps, and compare them on held-out text.

Every run goes through the real trainer (``pretrain/train.py`` under the DeepSpeed launcher, ZeRO-2 by default) and
is evaluated by the trainer itself at ``--eval-interval`` on the same held-out batches: the validation set comes from
separate shards of whole held-out documents (``--valid-data-path``), or from the whole-document valid split of the
training shards, and is sampled and masked with one fixed ``--valid-seed`` for every config and training seed. The
script writes ``results.json`` (every run's evaluations, step time, peak memory, training time, tokens, plus a
per-config summary) and PNG plots: validation perplexity vs step, vs training time and vs tokens, and peak memory /
step time per config.

An interrupted comparison resumes: finished runs (``done.json``) are skipped, an unfinished run continues from its
newest checkpoint (the trainer's ``--load``), so a long comparison can be spread over several sittings.

    .venv/bin/python -m benchmarks.pretrain_compare --out /work/compare_runs/cmp --preset cpu-small \\
        --data-path 0.5 books_text_sentence 0.5 wiki_text_sentence \\
        --valid-data-path 0.5 vbooks_text_sentence 0.5 vwiki_text_sentence --vocab-file vocab.txt
    # table + plots from what ran: the same command with --report-only (the flags define the runs); copies of the
    # plots and results.json for the docs with --figures-dir docs/figures (as compare_*.png, compare_results.json)

``--preset bert-base`` is the paper-scale encoder (12 x 768, N=512, bf16, global batch 256) for a GPU node.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

REPO = Path(__file__).resolve().parents[1]


class CompareError(RuntimeError):
    """A comparison cannot go on; the message says why and what to do."""


# --------------------------------------------------------------------------------------------------- settings
@dataclasses.dataclass(frozen=True)
class Preset:
    """Encoder size and training length shared by every config of a comparison."""

    num_layers: int
    hidden_size: int
    num_heads: int
    ffn_hidden_size: int
    seq_length: int
    micro_batch_size: int
    global_batch_size: int | None  # None: micro batch x ranks
    train_iters: int
    eval_interval: int
    eval_iters: int
    log_interval: int
    lr: float
    ds_config: str
    strided_stride: int  # SparseBERT strided l: ~70% sparsity at this N, as Table 3's strided (70.4% at n=128)


PRESETS: dict[str, Preset] = {
    # the test's scale: seconds per run on 2 CPU cores
    "tiny": Preset(
        num_layers=2,
        hidden_size=64,
        num_heads=4,
        ffn_hidden_size=128,
        seq_length=128,
        micro_batch_size=2,
        global_batch_size=None,
        train_iters=6,
        eval_interval=3,
        eval_iters=2,
        log_interval=1,
        lr=1e-3,
        ds_config="ds_configs/zero2_fp32.json",
        strided_stride=16,
    ),
    # the committed CPU comparison (docs/results.md): ~1 s per step on the 2-core dev box (2 ranks x 4 x 512)
    "cpu-small": Preset(
        num_layers=4,
        hidden_size=128,
        num_heads=4,
        ffn_hidden_size=512,
        seq_length=512,
        micro_batch_size=4,
        global_batch_size=None,
        train_iters=500,
        eval_interval=50,
        eval_iters=8,
        log_interval=10,
        lr=2e-3,
        ds_config="ds_configs/zero2_fp32.json",
        strided_stride=80,
    ),
    # BERT-base at N=512 with the blockwise paper's batch (131,072 tokens) for a GPU node; set --train-iters
    "bert-base": Preset(
        num_layers=12,
        hidden_size=768,
        num_heads=12,
        ffn_hidden_size=3072,
        seq_length=512,
        micro_batch_size=32,
        global_batch_size=256,
        train_iters=20000,
        eval_interval=1000,
        eval_iters=50,
        log_interval=100,
        lr=5e-4,
        ds_config="ds_configs/zero2_bf16.json",
        strided_stride=80,
    ),
}

CONFIG_NAMES = ("dense", "blockbert_n2", "blockbert_n3", "sparsebert_strided", "diet_rel", "diet_abs")
DEFAULT_CONFIGS = ("dense", "blockbert_n2", "blockbert_n3", "sparsebert_strided", "diet_rel")


def head_assignment(num_heads: int, blocks: int) -> str:
    """The blockwise paper's split scaled to ``num_heads``: 12 heads -> 10:2 (n=2), 8:2:2 (n=3); 4 -> 3:1, 2:1:1."""
    shifted = max(1, round(num_heads / 6))
    first = num_heads - shifted * (blocks - 1)
    if first < 1:
        raise CompareError(f"{num_heads} heads cannot be split over {blocks} BlockBERT permutations")
    return ":".join([str(first)] + [str(shifted)] * (blocks - 1))


def attention_and_position(config: str, preset: Preset) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """ModelConfig ``attention`` fields and ``position`` block of a named config (see the flags of
    run_scripts/pretrain_*.sh: the same set-ups, scaled to the preset's heads and N)."""
    n = preset.seq_length
    if config == "dense":  # RoBERTa-1seq
        return {"kernel": "dense"}, None
    if config in ("blockbert_n2", "blockbert_n3"):
        blocks = int(config[-1])
        return {
            "kernel": "auto",
            "sparsity": {
                "mode": "blockbert",
                "num_blocks": blocks,
                "block": 16,
                "head_assignment": head_assignment(preset.num_heads, blocks),
            },
        }, None
    if config == "sparsebert_strided":
        return {
            "kernel": "auto",
            "token_mask": {"pattern": "strided", "stride": preset.strided_stride, "seq_len": n},
        }, None
    if config == "diet_rel":
        return {"kernel": "auto"}, {"type": "diet_rel", "max_distance": min(128, n), "sharing": "none"}
    if config == "diet_abs":
        return {"kernel": "auto"}, {"type": "diet_abs", "rank": min(128, preset.hidden_size), "sharing": "none"}
    raise CompareError(f"unknown config {config!r}; choose from {', '.join(CONFIG_NAMES)}")


def model_config_dict(config: str, preset: Preset) -> dict[str, Any]:
    """The full ModelConfig (validated by ModelConfig.from_dict) a run trains; vocab comes from the tokenizer."""
    from model.config import ModelConfig

    d = ModelConfig.preset(
        "bert-base",
        num_layers=preset.num_layers,
        hidden_size=preset.hidden_size,
        num_attention_heads=preset.num_heads,
        intermediate_size=preset.ffn_hidden_size,
        max_position_embeddings=preset.seq_length,
    ).to_dict()
    attention, position = attention_and_position(config, preset)
    d["attention"].update(attention)
    if position is not None:
        d["position"] = position
    return ModelConfig.from_dict(d).to_dict()


@dataclasses.dataclass
class RunSpec:
    """One training run of the comparison: a config and a seed, with the exact trainer flags."""

    name: str
    config: str
    seed: int
    train_args: list[str]
    model_config: dict[str, Any]


def run_specs(ns: argparse.Namespace, preset: Preset) -> list[RunSpec]:
    """Every (config, seed) run, in the order they train: all configs at the first seed, then the extra seeds."""
    common = [
        "--deepspeed_config",
        ns.ds_config or preset.ds_config,
        "--seq-length",
        str(preset.seq_length),
        "--micro-batch-size",
        str(preset.micro_batch_size),
        "--train-iters",
        str(ns.train_iters or preset.train_iters),
        "--lr",
        str(ns.lr or preset.lr),
        "--min-lr",
        "0",
        "--lr-warmup-fraction",
        str(ns.warmup_fraction),
        "--lr-decay-style",
        "linear",
        "--weight-decay",
        "0.01",
        "--adam-beta1",
        "0.9",
        "--adam-beta2",
        "0.999",
        "--adam-eps",
        "1e-8",
        "--clip-grad",
        "1.0",
        "--sample-mode",
        "doc-sentences",
        "--tokenizer-type",
        ns.tokenizer_type,
        "--vocab-file",
        ns.vocab_file,
        "--data-path",
        *ns.data_path,
        "--eval-interval",
        str(ns.eval_interval or preset.eval_interval),
        "--eval-iters",
        str(ns.eval_iters or preset.eval_iters),
        "--log-interval",
        str(ns.log_interval or preset.log_interval),
        "--valid-seed",
        str(ns.valid_seed),
        "--num-workers",
        str(ns.num_workers),
    ]
    gbs = ns.global_batch_size or preset.global_batch_size
    if gbs:
        common += ["--global-batch-size", str(gbs)]
    common += ["--valid-data-path", *ns.valid_data_path] if ns.valid_data_path else ["--split", ns.split]
    specs = []
    seeds = list(ns.seeds)
    for k, seed in enumerate(seeds):
        for config in ns.configs:
            if k > 0 and config not in ns.seeded_configs:
                continue
            specs.append(
                RunSpec(
                    name=f"{config}_s{seed}",
                    config=config,
                    seed=seed,
                    train_args=common + ["--seed", str(seed)] + list(ns.train_arg),
                    model_config=model_config_dict(config, preset),
                )
            )
    return specs


# --------------------------------------------------------------------------------------------------- data
def prepare_data(
    out: Path,
    train_inputs: Sequence[str],
    valid_inputs: Sequence[str],
    vocab_file: str,
    tokenizer_type: str,
    workers: int,
) -> tuple[list[str], list[str]]:
    """Preprocess raw train and held-out inputs (files, dirs, globs) with data_pipeline.preprocess into
    ``out/data``; a shard that already exists is reused. Held-out documents never enter the training shard."""
    data = out / "data"
    prefixes = []
    for name, inputs in (("train", train_inputs), ("valid", valid_inputs)):
        prefix = data / name
        shard = Path(f"{prefix}_text_sentence")
        if not Path(f"{shard}.idx").exists():
            cmd = [
                sys.executable,
                "-m",
                "data_pipeline.preprocess",
                "--input",
                *inputs,
                "--output-prefix",
                str(prefix),
                "--tokenizer-type",
                tokenizer_type,
                "--vocab-file",
                vocab_file,
                "--split-sentences",
                "--workers",
                str(workers),
            ]
            print(f"[compare] preprocess {name}: {' '.join(cmd)}", flush=True)
            subprocess.run(cmd, cwd=REPO, check=True)
        prefixes.append(str(shard))
    return [prefixes[0]], [prefixes[1]]


# --------------------------------------------------------------------------------------------------- running
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launcher_command(ns: argparse.Namespace) -> list[str]:
    """The launcher prefix: deepspeed on one node (CPU ranks on gloo when there is no GPU), a hostfile, or
    torchrun; each launch gets its own master port unless --master-port is given (other jobs may hold 29500)."""
    bindir = Path(sys.executable).parent
    port = str(ns.master_port or _free_port())
    if ns.launcher == "deepspeed":
        return [str(bindir / "deepspeed"), "--num_gpus", str(ns.nproc), "--master_port", port, *ns.launcher_arg]
    if ns.launcher == "hostfile":
        if not ns.hostfile:
            raise CompareError("--launcher hostfile needs --hostfile FILE (format: run_scripts/hostfile.example)")
        return [str(bindir / "deepspeed"), "--hostfile", ns.hostfile, "--master_port", port, *ns.launcher_arg]
    if ns.launcher == "torchrun":
        return [str(bindir / "torchrun"), "--nproc_per_node", str(ns.nproc), "--master_port", port, *ns.launcher_arg]
    raise CompareError(f"--launcher {ns.launcher}: use deepspeed, hostfile or torchrun")


def read_log(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(training records, validation records) of a run's --log-json, one per iteration: a resumed run repeats the
    iterations after its checkpoint, and the later (resumed) record wins."""
    train: dict[int, dict[str, Any]] = {}
    valid: dict[int, dict[str, Any]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            rec = json.loads(line)
            (valid if "valid" in rec else train)[int(rec["iteration"])] = rec
    return [train[k] for k in sorted(train)], [valid[k] for k in sorted(valid)]


def _spec_json(spec: RunSpec) -> dict[str, Any]:
    return {
        "name": spec.name,
        "config": spec.config,
        "seed": spec.seed,
        "train_args": spec.train_args,
        "model_config": spec.model_config,
    }


def _check_spec(run_dir: Path, spec: RunSpec) -> None:
    """A run directory belongs to one set of flags: resuming it with others would mix two experiments."""
    path = run_dir / "spec.json"
    if path.exists():
        old = json.loads(path.read_text())
        if old != _spec_json(spec):
            diff = [k for k in old if old.get(k) != _spec_json(spec).get(k)]
            raise CompareError(
                f"{run_dir} was started with other settings ({', '.join(diff)} differ); use another "
                f"--out, or delete that run directory to retrain it"
            )
    else:
        run_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(_spec_json(spec), indent=1))


def train_run(ns: argparse.Namespace, spec: RunSpec, run_dir: Path) -> bool:
    """Train (or continue) one run to its last iteration. Returns True when it is complete."""
    _check_spec(run_dir, spec)
    (run_dir / "model.json").write_text(json.dumps(spec.model_config, indent=1))
    ckpt = run_dir / "ckpt"
    eval_interval = int(spec.train_args[spec.train_args.index("--eval-interval") + 1])
    cmd = launcher_command(ns) + [
        "pretrain/train.py",
        *spec.train_args,
        "--model-config",
        str(run_dir / "model.json"),
        "--save",
        str(ckpt),
        "--load",
        str(ckpt),
        "--save-interval",
        str(eval_interval),
        "--keep-last",
        "1",
        "--log-json",
        str(run_dir / "log.jsonl"),
    ]
    env = dict(os.environ)
    env.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".venv" / "torch_extensions"))
    env["PYTHONUNBUFFERED"] = "1"
    start = time.time()
    with open(run_dir / "stdout.log", "a", buffering=1) as log:  # line-buffered: tail -f works
        log.write(f"\n# {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n")
        log.flush()
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        try:
            for line in proc.stdout:
                log.write(line)
                if line.startswith("[pretrain]") and (
                    "validation" in line or "resumed" in line or "iteration" in line and ns.verbose
                ):
                    print(f"[compare] {spec.name}: {line[11:].rstrip()}", flush=True)
            rc = proc.wait()
        except BaseException:  # Ctrl-C or a kill: take the ranks down with us, the checkpoint stays
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait()
            raise
    segments = run_dir / "launches.jsonl"
    with open(segments, "a") as f:
        f.write(json.dumps({"start": start, "wall_s": time.time() - start, "rc": rc}) + "\n")
    if rc != 0:
        tail = "".join((run_dir / "stdout.log").read_text().splitlines(keepends=True)[-30:])
        raise CompareError(f"{spec.name}: the trainer exited with code {rc}; see {run_dir / 'stdout.log'}:\n{tail}")
    train, _ = read_log(run_dir / "log.jsonl")
    iters = int(spec.train_args[spec.train_args.index("--train-iters") + 1])
    return bool(train) and train[-1]["iteration"] >= iters


# --------------------------------------------------------------------------------------------------- checks
def _run_config(spec: RunSpec, run_dir: Path):
    from pretrain.args import parse_args

    return parse_args(spec.train_args + ["--model-config", str(run_dir / "model.json")])


def valid_batches(spec: RunSpec, run_dir: Path, world_size: int):
    """The validation batches the trainer's evaluate() sees, per rank in rank order (built by the trainer's own
    builders with this run's flags)."""
    from pretrain import builders
    from pretrain.args import train_iterations
    from pretrain.ds_config import read_ds_config, resolve_batch_sizes

    run = _run_config(spec, run_dir)
    tok = builders.build_tokenizer(run.data)
    micro, _, gbs = resolve_batch_sizes(
        read_ds_config(run.system.deepspeed_config), run.loop.micro_batch_size, run.loop.global_batch_size, world_size
    )
    iters = train_iterations(run.loop, gbs)
    _, valid, _ = builders.build_datasets(run, tok, iters * gbs, iters, gbs)
    if valid is None:
        raise CompareError(f"{spec.name}: no validation data")
    out = []
    for rank in range(world_size):
        it = iter(builders.build_dataloader(run, valid, tok, micro, rank, world_size, 0, 0, valid=True))
        for _ in range(run.loop.eval_iters):
            try:
                out.append(next(it))
            except StopIteration:
                break
    return run, tok, out


def valid_fingerprint(spec: RunSpec, run_dir: Path, world_size: int) -> str:
    """sha256 of the held-out batches (token ids and MLM labels): equal for every run means every config and seed
    was evaluated on the same documents, samples and masks."""
    _, _, batches = valid_batches(spec, run_dir, world_size)
    h = hashlib.sha256()
    for b in batches:
        h.update(b["input_ids"].numpy().tobytes())
        h.update(b["labels"].numpy().tobytes())
    return h.hexdigest()[:16]


def unigram_baseline(spec: RunSpec, run_dir: Path, world_size: int) -> dict[str, float]:
    """The validation MLM loss, perplexity and accuracy of a model that knows only token frequencies: the training
    shards' unigram distribution (add-one smoothed, blended with the --data-path weights as in training) scored on
    the masked tokens of the same held-out batches. A run at this level has learned nothing from the context."""
    import numpy as np

    from data_pipeline.data_config import parse_data_path
    from data_pipeline.indexed import IndexedDataset

    run, tok, batches = valid_batches(spec, run_dir, world_size)
    blend = parse_data_path(run.data.data_path)
    weights = [1.0 if w is None else float(w) for w, _ in blend]
    p = np.zeros(tok.vocab_size)
    for (_, prefix), w in zip(blend, weights):
        counts = np.bincount(np.asarray(IndexedDataset(prefix).tokens), minlength=tok.vocab_size).astype(np.float64)
        counts += 1.0  # add-one smoothing: a held-out token never seen in training must not make the loss infinite
        p += w / sum(weights) * counts / counts.sum()
    labels = np.concatenate([b["labels"].numpy().ravel() for b in batches])
    labels = labels[labels != -100]
    loss = float(-np.log(p[labels]).mean())
    return {
        "loss": loss,
        "perplexity": math.exp(loss),
        "mlm_accuracy": float((labels == p.argmax()).mean()),
        "tokens": int(len(labels)),
    }


def evaluate_checkpoint(spec: RunSpec, run_dir: Path, world_size: int) -> dict[str, float]:
    """Re-evaluate a run's newest checkpoint in this process (fp32 weights via pretrain.checkpoint, the trainer's
    validation batches): a check that the trainer's logged validation is reproducible from the checkpoint."""
    import torch

    from pretrain import builders, checkpoint
    from pretrain.ds_config import read_ds_config

    run, tok, batches = valid_batches(spec, run_dir, world_size)
    ckpt = run_dir / "ckpt"
    tag = checkpoint.find_resume_tag(ckpt)
    if tag is None:
        raise CompareError(f"{spec.name}: no complete checkpoint in {ckpt}")
    client = checkpoint.read_client_state(ckpt, tag)
    ds = read_ds_config(run.system.deepspeed_config)  # a legacy sparse_attention block belongs to the model
    cfg = builders.build_model_config(run.model, run.data, tok.vocab_size, ds.sparse_attention, ds.path)
    model = builders.build_model(cfg)
    model.load_state_dict(checkpoint.load_fp32_weights(ckpt, tag), strict=True)
    if client.get("layout_state") is not None:
        model.load_layout_state(client["layout_state"])
    model.eval()
    loss_sum = correct = count = 0.0
    with torch.no_grad():
        for b in batches:
            keys = ["input_ids", "attention_mask", "token_type_ids", "labels"]
            if bool(b["attention_mask"].all()):  # as Trainer._to_device: no padding, no mask
                keys.remove("attention_mask")
            out = model(**{k: b[k] for k in keys})
            loss_sum += float(out.mlm_loss.double() * out.mlm_count)
            correct += float(out.mlm_correct)
            count += float(out.mlm_count)
    loss = loss_sum / max(count, 1.0)
    return {
        "iteration": int(client["iteration"]),
        "loss": loss,
        "perplexity": math.exp(min(loss, 50.0)),
        "mlm_accuracy": correct / max(count, 1.0),
    }


# --------------------------------------------------------------------------------------------------- results
STALL_FACTOR = 10.0
"""A log window slower than this many times the run's median step is a stall of the machine (a suspended VM, a
descheduled job), not the model's cost: the training-time axis counts it at the median step time and the run
lists it under ``stalls``."""


def summarize_run(spec: RunSpec, run_dir: Path, seq_length: int) -> dict[str, Any]:
    """A run's curve and costs from its own logs: training time and tokens are accumulated from the trainer's
    log windows (evaluation, checkpointing and start-up excluded), so a resumed run counts each step once."""
    train, valid = read_log(run_dir / "log.jsonl")
    windows = []  # (iteration, steps, seconds, real tokens)
    prev = 0
    for rec in train:
        it = int(rec["iteration"])
        n = it - prev
        if n <= 0 or not rec.get("samples_per_s"):
            continue
        gbs = rec["consumed_samples"] / it
        dt = n * gbs / rec["samples_per_s"]
        windows.append((it, n, dt, rec["tokens_per_s"] * dt))
        prev = it
    # the first window holds loader warm-up
    step_times = [dt / n for _, n, dt, _ in windows[1:]] or [dt / n for _, n, dt, _ in windows]
    median = statistics.median(step_times) if step_times else None
    times, tokens, stalls = {0: 0.0}, {0: 0.0}, []
    t_acc = tok_acc = 0.0
    for it, n, dt, tok in windows:
        if median and dt / n > STALL_FACTOR * median:
            stalls.append({"iteration": it, "steps": n, "seconds": round(dt, 1)})
            dt = n * median
        t_acc += dt
        tok_acc += tok
        times[it], tokens[it] = t_acc, tok_acc
    evals = []
    for rec in valid:
        it = int(rec["iteration"])
        if it not in times:
            continue
        evals.append(
            {
                "iteration": it,
                "train_time_s": round(times[it], 3),
                "tokens": int(tokens[it]),
                **{k: float(v) for k, v in rec["valid"].items()},
            }
        )
    launches = []
    if (run_dir / "launches.jsonl").exists():
        launches = [json.loads(x) for x in (run_dir / "launches.jsonl").read_text().splitlines() if x.strip()]
    return {
        "config": spec.config,
        "seed": spec.seed,
        "iterations": train[-1]["iteration"] if train else 0,
        "evals": evals,
        "final": evals[-1] if evals else None,
        "step_time_s": median,
        "stalls": stalls,
        "train_time_s": round(t_acc, 3),
        "tokens": int(tok_acc),
        "peak_memory_mb": max((r["memory"] for r in train), default=None),
        "launch_wall_s": round(sum(x["wall_s"] for x in launches), 1),
        "launches": len(launches),
        "final_train_loss": train[-1]["loss"] if train else None,
        "seq_length": seq_length,
        "done": (run_dir / "done.json").exists(),
    }


def _mean_std(xs: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(xs), "std": statistics.stdev(xs) if len(xs) > 1 else 0.0, "n": len(xs)}


def summarize(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per config: final validation loss/perplexity/accuracy, step time and peak memory over its seeds, and the
    ratios to dense (time and memory savings as the blockwise paper's Table 2 reports them)."""
    by_config: dict[str, list[dict[str, Any]]] = {}
    for r in runs.values():
        if r["final"] is not None:
            by_config.setdefault(r["config"], []).append(r)
    out: dict[str, Any] = {}
    for config, rs in by_config.items():
        out[config] = {
            "seeds": sorted(r["seed"] for r in rs),
            "final_iteration": min(r["final"]["iteration"] for r in rs),
            "loss": _mean_std([r["final"]["loss"] for r in rs]),
            "perplexity": _mean_std([r["final"]["perplexity"] for r in rs]),
            "mlm_accuracy": _mean_std([r["final"]["mlm_accuracy"] for r in rs]),
            "step_time_s": _mean_std([r["step_time_s"] for r in rs]),
            "peak_memory_mb": _mean_std([r["peak_memory_mb"] for r in rs]),
        }
    if "dense" in out:
        d = out["dense"]
        for config, s in out.items():
            s["time_vs_dense"] = s["step_time_s"]["mean"] / d["step_time_s"]["mean"]
            s["memory_vs_dense"] = s["peak_memory_mb"]["mean"] / d["peak_memory_mb"]["mean"]
            s["perplexity_vs_dense"] = s["perplexity"]["mean"] / d["perplexity"]["mean"]
    return out


def machine_info() -> dict[str, Any]:
    """What the timings were taken on (CPU model, cores, GPUs, library versions)."""
    import torch

    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {
        "cpu": cpu,
        "cpu_cores": os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
    }
    try:
        import deepspeed

        info["deepspeed"] = deepspeed.__version__
    except Exception:  # noqa: BLE001 - the version is informative only
        pass
    return info


def plot(results: dict[str, Any], out_dir: Path) -> list[Path]:
    """perplexity vs step / training time / tokens, and step time + peak memory per config, as PNGs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    runs = results["runs"]
    configs = list(dict.fromkeys(r["config"] for r in runs.values()))
    colors = {c: plt.get_cmap("tab10")(i % 10) for i, c in enumerate(configs)}
    seeds = sorted({r["seed"] for r in runs.values()})
    styles = ["-", "--", ":", "-."]
    paths = []
    for key, label, fname, scale in (
        ("iteration", "optimizer step", "ppl_vs_step.png", 1.0),
        ("train_time_s", "training time (min, evaluation excluded)", "ppl_vs_time.png", 1 / 60),
        ("tokens", "training tokens (millions)", "ppl_vs_tokens.png", 1e-6),
    ):
        fig, ax = plt.subplots(figsize=(8.4, 4.6), dpi=90)
        for name, r in runs.items():
            if not r["evals"]:
                continue
            xs = [e[key] * scale for e in r["evals"]]
            ys = [e["perplexity"] for e in r["evals"]]
            ax.plot(
                xs,
                ys,
                styles[seeds.index(r["seed"]) % len(styles)],
                color=colors[r["config"]],
                marker=".",
                label=f"{r['config']} (seed {r['seed']})",
                linewidth=1.2,
            )
        ax.set_yscale("log")
        plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(plain)
        ax.tick_params(axis="y", which="minor", labelsize=7)
        ax.set_xlabel(label)
        ax.set_ylabel("validation MLM perplexity (held-out documents)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the curves, not over them
        fig.tight_layout()
        fig.savefig(out_dir / fname)
        plt.close(fig)
        paths.append(out_dir / fname)
    summary = results["summary"]
    if summary:
        names = list(summary)
        fig, axes = plt.subplots(1, 2, figsize=(8.4, 3.6), dpi=90)
        for ax, key, label, k in (
            (axes[0], "step_time_s", "median step time (s)", 1.0),
            (axes[1], "peak_memory_mb", "peak memory, rank 0 (MB)", 1.0),
        ):
            means = [summary[c][key]["mean"] * k for c in names]
            stds = [summary[c][key]["std"] * k for c in names]
            ax.bar(range(len(names)), means, yerr=stds, color=[colors.get(c, "gray") for c in names])
            ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
            ax.set_ylabel(label)
            ax.grid(True, axis="y", alpha=0.3)
        fig.tight_layout()
        fig.savefig(out_dir / "cost.png")
        plt.close(fig)
        paths.append(out_dir / "cost.png")
    return paths


def report(ns: argparse.Namespace, specs: list[RunSpec], preset_name: str, preset: Preset) -> dict[str, Any]:
    """Write results.json and the plots from whatever has run so far."""
    out = Path(ns.out)
    runs = {}
    for spec in specs:
        run_dir = out / "runs" / spec.name
        if (run_dir / "log.jsonl").exists():
            runs[spec.name] = summarize_run(spec, run_dir, preset.seq_length)
            done = run_dir / "done.json"
            if done.exists():
                runs[spec.name].update(
                    {k: v for k, v in json.loads(done.read_text()).items() if k in ("valid_fingerprint", "recheck")}
                )
    fingerprints = {r.get("valid_fingerprint") for r in runs.values() if r.get("valid_fingerprint")}
    unigram_file = out / "unigram_baseline.json"
    if not unigram_file.exists():
        first = next((spec for spec in specs if (out / "runs" / spec.name / "done.json").exists()), None)
        if first is not None:  # the validation batches are the same for every run (the fingerprints say so)
            unigram_file.write_text(json.dumps(unigram_baseline(first, out / "runs" / first.name, ns.nproc)))
    results = {
        "preset": preset_name,
        "settings": dataclasses.asdict(preset),
        "command": " ".join([Path(sys.executable).name, "-m", "benchmarks.pretrain_compare", *ns.argv]),
        "machine": machine_info(),
        "launcher": ns.launcher,
        "nproc": ns.nproc,
        "same_validation_batches": len(fingerprints) <= 1,
        "runs": runs,
        "summary": summarize(runs),
        "unigram_baseline": json.loads(unigram_file.read_text()) if unigram_file.exists() else None,
    }
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "table.md").write_text(markdown_table(results))
    results["plots"] = [str(p) for p in plot(results, out)]
    if getattr(ns, "figures_dir", None):  # the copies docs/results.md shows, e.g. docs/figures/compare_*.png
        import shutil

        fig_dir = Path(ns.figures_dir)
        fig_dir.mkdir(parents=True, exist_ok=True)
        for src in [*results["plots"], out / "results.json"]:
            shutil.copyfile(src, fig_dir / f"{ns.figures_prefix}{Path(src).name}")
    return results


def markdown_table(results: dict[str, Any]) -> str:
    """The summary as a markdown table (docs/results.md pastes it): mean ± std over seeds where there are several."""

    def pm(d: dict[str, float], fmt: str) -> str:
        return format(d["mean"], fmt) + (f" ± {format(d['std'], fmt)}" if d["n"] > 1 else "")

    rows = [
        "| config | seeds | step | valid loss | valid ppl | MLM acc | step time (s) | vs dense "
        "| peak RSS rank 0 (MB) | vs dense |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for config, s in results["summary"].items():
        rows.append(
            f"| {config} | {len(s['seeds'])} | {s['final_iteration']} | {pm(s['loss'], '.3f')} | "
            f"{pm(s['perplexity'], '.1f')} | {pm(s['mlm_accuracy'], '.4f')} | {pm(s['step_time_s'], '.3f')} | "
            f"{s.get('time_vs_dense', float('nan')):.2f}x | {pm(s['peak_memory_mb'], '.0f')} | "
            f"{s.get('memory_vs_dense', float('nan')):.2f}x |"
        )
    u = results.get("unigram_baseline")
    if u:
        rows.append(
            f"| *unigram baseline* | | | {u['loss']:.3f} | {u['perplexity']:.1f} | {u['mlm_accuracy']:.4f} | | | | |"
        )
    return "\n".join(rows) + "\n"


def print_table(results: dict[str, Any]) -> None:
    print(
        "[compare] config              seeds  step  final ppl (mean±std)  mlm acc  step s  vs dense  peak MB  vs dense"
    )
    for config, s in results["summary"].items():
        print(
            f"[compare] {config:<20} {len(s['seeds']):>5} {s['final_iteration']:>5}  "
            f"{s['perplexity']['mean']:>9.2f} ± {s['perplexity']['std']:<7.2f}  {s['mlm_accuracy']['mean']:.4f}  "
            f"{s['step_time_s']['mean']:6.3f}  {s.get('time_vs_dense', float('nan')):8.3f}  "
            f"{s['peak_memory_mb']['mean']:7.0f}  {s.get('memory_vs_dense', float('nan')):8.3f}"
        )


# --------------------------------------------------------------------------------------------------- CLI
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="benchmarks.pretrain_compare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", required=True, help="comparison directory (runs/, results.json, table.md, plots)")
    p.add_argument("--preset", choices=sorted(PRESETS), default="cpu-small")
    p.add_argument("--configs", nargs="+", default=list(DEFAULT_CONFIGS), choices=CONFIG_NAMES)
    p.add_argument(
        "--seeds",
        nargs="+",
        type=int,
        default=[1234, 1235],
        help="the first seed trains every config; later seeds only --seeded-configs",
    )
    p.add_argument("--seeded-configs", nargs="*", default=["dense", "blockbert_n2"])
    p.add_argument("--valid-seed", type=int, default=4321, help="one seed for the held-out samples and masks")
    d = p.add_argument_group("data (shards, or raw inputs preprocessed into OUT/data)")
    d.add_argument("--data-path", nargs="+", help="training shards, Megatron style (weights optional)")
    d.add_argument("--valid-data-path", nargs="+", help="held-out shards of whole documents")
    d.add_argument("--split", default="98,2,0", help="without validation shards: whole-document split of --data-path")
    d.add_argument("--train-inputs", nargs="+", help="raw training text (files, dirs, globs) to preprocess")
    d.add_argument("--valid-inputs", nargs="+", help="raw held-out text (whole documents/books) to preprocess")
    d.add_argument("--vocab-file", required=True)
    d.add_argument("--tokenizer-type", default="BertWordPieceLowerCase")
    d.add_argument("--preprocess-workers", type=int, default=2)
    t = p.add_argument_group("training (defaults from --preset)")
    t.add_argument("--train-iters", type=int)
    t.add_argument("--eval-interval", type=int)
    t.add_argument("--eval-iters", type=int)
    t.add_argument("--log-interval", type=int)
    t.add_argument("--global-batch-size", type=int)
    t.add_argument("--lr", type=float)
    t.add_argument("--warmup-fraction", type=float, default=0.1)
    t.add_argument("--ds-config", help="DeepSpeed config (default: the preset's, ZeRO-2)")
    t.add_argument("--num-workers", type=int, default=1, help="DataLoader workers per rank")
    t.add_argument(
        "--train-arg",
        action="append",
        default=[],
        help="extra trainer flag, repeatable (--train-arg=--checkpoint-activations)",
    )
    la = p.add_argument_group("launcher")
    la.add_argument("--launcher", choices=["deepspeed", "hostfile", "torchrun"], default="deepspeed")
    la.add_argument("--nproc", type=int, default=2, help="ranks (GPUs, or CPU ranks on gloo without GPUs)")
    la.add_argument(
        "--hostfile", help="with --launcher hostfile: DeepSpeed hostfile (see run_scripts/hostfile.example)"
    )
    la.add_argument("--master-port", type=int, help="default: a free port per launch")
    la.add_argument("--launcher-arg", action="append", default=[], help="extra launcher flag, repeatable")
    r = p.add_argument_group("sittings")
    r.add_argument("--stop-after", type=int, help="stop after this many runs trained in this sitting")
    r.add_argument(
        "--report-only", action="store_true", help="with the comparison's own flags: write results.json and plots only"
    )
    r.add_argument("--figures-dir", help="also copy the plots and results.json here (e.g. docs/figures)")
    r.add_argument("--figures-prefix", default="compare_", help="file name prefix of those copies")
    r.add_argument(
        "--recheck",
        action="store_true",
        help="re-evaluate each finished run's final checkpoint in-process (reproducibility check)",
    )
    r.add_argument(
        "--keep-checkpoints",
        action="store_true",
        help="keep finished runs' checkpoints (default: deleted once the run is done and checked)",
    )
    p.add_argument("--verbose", action="store_true", help="echo every training log line")
    return p


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ns = build_parser().parse_args(argv)
    ns.argv = list(sys.argv[1:] if argv is None else argv)
    if ns.data_path is None and ns.train_inputs is None:
        raise CompareError("give --data-path (shards) or --train-inputs/--valid-inputs (raw text)")
    if (ns.train_inputs is None) != (ns.valid_inputs is None):
        raise CompareError("--train-inputs and --valid-inputs go together (held-out documents must be separate)")
    if ns.data_path is not None and ns.train_inputs is not None:
        raise CompareError("give either --data-path or --train-inputs, not both")
    if not Path(ns.vocab_file).is_file():
        raise CompareError(f"--vocab-file {ns.vocab_file}: no such file")
    # the ranks and the preprocessor run in the repository root, and a run directory's spec.json must not depend on
    # the directory the comparison was started from: every path becomes absolute
    ns.vocab_file = os.path.abspath(ns.vocab_file)
    for name in ("data_path", "valid_data_path", "train_inputs", "valid_inputs"):
        if getattr(ns, name) is not None:
            setattr(ns, name, [item if _is_weight(item) else os.path.abspath(item) for item in getattr(ns, name)])
    return ns


def _is_weight(item: str) -> bool:
    try:
        float(item)
    except ValueError:
        return False
    return True


def _terminate(signum: int, frame: Any) -> None:
    """SIGTERM/SIGHUP (e.g. `kill` of a nohup'ed comparison): unwind like Ctrl-C, so the ranks are stopped too."""
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    previous = {sig: signal.signal(sig, _terminate) for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    try:
        ns = parse(argv)
        preset = PRESETS[ns.preset]
        out = Path(ns.out)
        out.mkdir(parents=True, exist_ok=True)
        if ns.train_inputs is not None:
            ns.data_path, ns.valid_data_path = prepare_data(
                out, ns.train_inputs, ns.valid_inputs, ns.vocab_file, ns.tokenizer_type, ns.preprocess_workers
            )
        specs = run_specs(ns, preset)
        world = ns.nproc
        trained = 0
        for spec in [] if ns.report_only else specs:
            run_dir = out / "runs" / spec.name
            if (run_dir / "done.json").exists():
                _check_spec(run_dir, spec)
                print(f"[compare] {spec.name}: done, skipped", flush=True)
                continue
            if ns.stop_after is not None and trained >= ns.stop_after:
                print(f"[compare] --stop-after {ns.stop_after}: stopping; run the same command to continue", flush=True)
                break
            print(f"[compare] {spec.name}: training ({spec.config}, seed {spec.seed})", flush=True)
            complete = train_run(ns, spec, run_dir)
            trained += 1
            if not complete:
                print(f"[compare] {spec.name}: the trainer stopped early; run the same command to continue", flush=True)
                break
            done: dict[str, Any] = {"valid_fingerprint": valid_fingerprint(spec, run_dir, world)}
            if ns.recheck:
                done["recheck"] = evaluate_checkpoint(spec, run_dir, world)
            (run_dir / "done.json").write_text(json.dumps(done, indent=1))
            if not ns.keep_checkpoints:
                import shutil

                shutil.rmtree(run_dir / "ckpt", ignore_errors=True)
            report(ns, specs, ns.preset, preset)  # a table after every run: a later failure loses nothing
        results = report(ns, specs, ns.preset, preset)
        print_table(results)
        if not results["same_validation_batches"]:
            raise CompareError("the runs were evaluated on different validation batches (fingerprints differ)")
        print(f"[compare] wrote {out / 'results.json'} and {', '.join(Path(p).name for p in results['plots'])}")
        return 0
    except CompareError as e:
        print(f"[compare] error: {e}", file=sys.stderr)
        return 2
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


if __name__ == "__main__":
    sys.exit(main())
