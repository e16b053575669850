"""The training step every measure runs: a DeepSpeed engine over a :class:`benchmarks.step.case.Case`'s model, fed
the inputs the trainer would give it (synthetic full rows, or the data pipeline's own batches)."""

from __future__ import annotations

import gc
from pathlib import Path

import torch

from benchmarks.step.case import Case, case_model_config
from model.flops import layout_density, model_flops_per_token


def init_single_rank() -> torch.device:
    """One rank's process group, as the trainer makes it; the device it trains on."""
    from pretrain.distributed import init_distributed

    return init_distributed(10.0).device


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _pipeline_batches(args, seq_len: int, batch: int, n: int, mode: str) -> tuple[list[dict], int | None]:
    """``n`` host batches as the trainer's loader makes them, and the MLM cap it uses."""
    from data_pipeline.batching import build_dataloader
    from data_pipeline.data_config import DataConfig
    from data_pipeline.datasets import build_datasets
    from data_pipeline.tokenization import build_tokenizer

    tok = build_tokenizer(args.tokenizer_type, vocab_file=args.vocab_file)
    cfg = DataConfig(data_path=[args.data_path], seq_length=seq_len, split="1,0,0", sample_mode=mode)
    train = build_datasets(cfg, tok, num_samples=(batch * n, 0, 0))[0]
    loader = build_dataloader(train, tok, cfg, micro_batch_size=batch, dp_rank=0, dp_world_size=1, num_workers=0)
    it = iter(loader)
    return [next(it) for _ in range(n)], cfg.max_predictions


def _real_tokens(host: dict) -> int:
    """Real (unpadded) tokens of a host batch, as the trainer counts them."""
    return int(host["attention_mask"].sum()) if "attention_mask" in host else host["input_ids"].numel()


class TrainStep:
    """A DeepSpeed engine over the model of a :class:`Case` and the inputs the trainer would give it (pretrain.trainer
    .device_batch, what Trainer._to_device calls: an all-ones mask dropped on the host, the static MLM gather with the
    derived cap). ``step()`` is one optimizer step on the next batch; ``close()`` frees the engine.

    ``args`` carries the shape (hidden, layers, heads, vocab_size, kernel: benchmarks.step.case.case_model_config),
    tokens (b x N when the case names no batch), warmup + steps (how many pipeline batches) and the data flags
    (data_path, vocab_file, tokenizer_type, sample_mode; data_path None: synthetic rows)."""

    def __init__(self, case: Case, args, device: torch.device) -> None:
        from benchmarks.support.measure import synthetic_batch
        from data_pipeline.masking import derived_max_predictions, six_sigma_slots
        from model.bert import BertForPreTraining
        from pretrain.args import OptimConfig
        from pretrain.ds_config import apply_clip_grad, check_compile_supported, read_ds_config, resolve_batch_sizes
        from pretrain.parallelize import apply_compile, initialize_engine
        from pretrain.schedule import schedule_settings
        from pretrain.trainer import device_batch

        repo = Path(__file__).resolve().parents[2]
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
        if case.mlm_head == "main" and cap is not None:  # the head before issue #47: its slots, its plain loss
            cap = six_sigma_slots(case.seq_len, 0.15)
        self.feed = [device_batch(h, device, cap) for h in self.hosts]
        if case.mlm_head == "main":
            self.feed = [dict(d, return_logits=True) for d in self.feed]
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
        """The kernels the first layer's attention ran, comma-separated ('' before the first step)."""
        return kernels_used(self.engine.module)

    def close(self) -> None:
        """Free the engine and the batches before the next case."""
        self.engine = self.feed = None
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def kernels_used(model: torch.nn.Module) -> str:
    """The kernels the first encoder layer's attention ran (``auto`` resolved to its choices), comma-separated; ''
    before the first forward."""
    core = model.bert.encoder.layers[0].attention.core
    used: set[str] = set()
    for plan in core._plans.values():
        chosen = getattr(plan, "chosen", None)  # auto's plan: its choice per dtype
        used |= set(chosen.values()) if chosen is not None else {core.kernel.name}
    return ",".join(sorted(used))
