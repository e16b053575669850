"""Collective traffic of one training step under DeepSpeed ZeRO, logged by DeepSpeed's own comms logger
(``"comms_logger": {"enabled": true, "prof_all": true}`` in the ds_config), per operation, against the count the
ZeRO stage's algorithm gives: stages 0-2 reduce the gradients (Psi elements in the communication dtype) and stages
1-2 all-gather the updated parameters (Psi elements in the model dtype); a ring moves 2(n-1)/n of an all-reduce's
bytes per rank and (n-1)/n of a reduce-scatter's or all-gather's. docs/performance.md projects step times on clusters
from these volumes.

Run on any number of ranks (CPU ranks on gloo work): one warm-up step (the engine's set-up broadcasts and the first
step's bucket set-up are left out), then the logged step.

    deepspeed --num_gpus 2 benchmarks/comm_volume.py --model-preset bert-base --zero 1 --json out/comm.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if __package__ in (None, ""):  # started as a file by the deepspeed launcher
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

FULL_SIZE = {"all_gather": True, "all_gather_into_tensor": True, "reduce_scatter": True, "reduce_scatter_tensor": True}
"""Ops whose logged message size is one rank's share (the whole message is n times it, as DeepSpeed's own
bandwidth calculation counts)."""
RING_SHARE = {"all_reduce": lambda n: 2 * (n - 1) / n}
"""Bytes a ring sends per rank, as a share of the whole message (default (n-1)/n: reduce-scatter, all-gather)."""


def one_step(engine, batch: dict) -> None:
    loss = engine(**batch).loss
    engine.backward(loss)
    engine.step()


def logged_ops(comms: dict, world: int) -> dict:
    """{op: {calls, message_bytes (whole messages), ring_bytes_per_rank}} from DeepSpeed's comms_dict."""
    ops = {}
    for name, sizes in comms.items():
        calls = sum(v[0] for v in sizes.values())
        raw = sum(size * v[0] for size, v in sizes.items())
        whole = raw * (world if FULL_SIZE.get(name) else 1)
        share = RING_SHARE.get(name, lambda n: (n - 1) / n)(world)
        ops[name] = {"calls": calls, "message_bytes": whole, "ring_bytes_per_rank": whole * share}
    return ops


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks/comm_volume.py", description=__doc__)
    p.add_argument("--model-preset", default="bert-base")
    p.add_argument("--zero", type=int, nargs="+", default=[0, 1, 2], help="ZeRO stages (ds_configs/zero{S}_*.json)")
    p.add_argument("--precision", default="bf16", choices=["bf16", "fp16", "fp32"])
    p.add_argument("--seq-len", type=int, default=32, help="tokens per row (the volume does not depend on it)")
    p.add_argument("--json", help="rank 0 writes the result here")
    p.add_argument("--local_rank", type=int, help=argparse.SUPPRESS)  # the deepspeed launcher's
    args = p.parse_args(argv)

    import deepspeed.comm as dscomm

    from benchmarks.support.measure import synthetic_batch
    from model.bert import BertForPreTraining
    from model.config import ModelConfig
    from pretrain.args import OptimConfig
    from pretrain.distributed import destroy_distributed, init_distributed
    from pretrain.ds_config import read_ds_config, resolve_batch_sizes
    from pretrain.parallelize import initialize_engine
    from pretrain.schedule import schedule_settings
    from pretrain.trainer import device_batch

    info = init_distributed(10.0)
    repo = Path(__file__).resolve().parents[1]
    rows = []
    for stage in args.zero:
        torch.manual_seed(0)
        cfg = ModelConfig.preset(args.model_preset, hidden_dropout=0.0, attention_dropout=0.0)
        model = BertForPreTraining(cfg)
        psi = sum(p.numel() for p in model.parameters())
        ds = read_ds_config(repo / "ds_configs" / f"zero{stage}_{args.precision}.json")
        ds.config["comms_logger"] = {"enabled": True, "prof_all": True, "verbose": False, "debug": False}
        resolve_batch_sizes(ds, 1, None, info.world_size)
        engine = initialize_engine(model, ds, OptimConfig(lr=1e-4), schedule_settings(1e-4, 0.0, 1, 100, "linear"))
        host = synthetic_batch(1, args.seq_len, cfg.vocab_size, torch.device("cpu"))
        batch = device_batch(host, info.device, args.seq_len)
        one_step(engine, batch)
        dscomm.comms_logger.comms_dict.clear()
        one_step(engine, batch)
        ops = logged_ops(dscomm.comms_logger.comms_dict, info.world_size)
        dtype_bytes = {"bf16": 2, "fp16": 2, "fp32": 4}[args.precision]
        rows.append(
            {
                "zero": stage,
                "parameters": psi,
                "world_size": info.world_size,
                "ops": ops,
                "message_bytes": sum(o["message_bytes"] for o in ops.values()),
                "ring_bytes_per_rank": sum(o["ring_bytes_per_rank"] for o in ops.values()),
                "psi_x_dtype_bytes": psi * dtype_bytes,
            }
        )
        engine = model = None
    if info.rank == 0:
        for r in rows:
            per_op = ", ".join(f"{k} {v['calls']} calls {v['message_bytes'] / 1e6:.1f} MB" for k, v in r["ops"].items())
            print(
                f"ZeRO-{r['zero']} {args.precision}: {r['parameters'] / 1e6:.2f} M parameters; messages "
                f"{r['message_bytes'] / 1e6:.1f} MB = {r['message_bytes'] / r['psi_x_dtype_bytes']:.3f} x Psi x "
                f"{args.precision} bytes; ring bytes per rank {r['ring_bytes_per_rank'] / 1e6:.1f} MB ({per_op})",
                flush=True,
            )
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps({"precision": args.precision, "rows": rows}, indent=1))
    destroy_distributed()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
