"""Preprocessing throughput: our pipeline vs the raw tokenizer vs Megatron-LM's ``tools/preprocess_data.py``.

    .venv/bin/python -m benchmarks.preprocess_throughput --megatron-repo /tmp/megatron-lm [--max-mb 12]

Measures, side by side in one run, on the books and WikiExtractor files of the shared corpus (BERT uncased vocab):
  * raw tokenizer: ``BertTokenizerFast`` backend ``encode_batch`` (and ``encode_batch_fast``) on the cleaned
    document texts, 1 and 2 threads (fresh subprocess each, rayon threads pinned);
  * our pipeline on the raw files (document and sentence level), ``--workers`` 1 and 2;
  * our pipeline and Megatron's script on the SAME jsonl (the cleaned documents, one per line), same vocab,
    same workers, document level (Megatron's ``--split-sentences`` needs NLTK punkt data, which is not on PyPI).
Times are wall-clock of the whole command; "net" subtracts each tool's fixed start-up cost (the same command
on a one-document input), since start-up (imports) is not throughput. Prints a table and writes JSON.

Megatron-LM's script is run from a checkout given by ``--megatron-repo`` (never vendored here). On a CPU box
without Triton and with Python 3.11 its import chain needs a shim (inert stubs for Megatron modules that import
Triton kernels; ``typing.override``) that this script writes to a temp dir and puts on PYTHONPATH; Megatron's
``BertWordPieceLowerCase`` loads ``AutoTokenizer('bert-large-uncased', vocab_file=...)``, which offline is served
from a local directory of that name holding the same vocab.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

_SHIM = """
import importlib.abc, importlib.machinery, sys, types, typing
if not hasattr(typing, "override"):
    typing.override = lambda f: f

class _Inert:
    def __init__(self, *a, **k): pass
    def __call__(self, *a, **k): return _Inert()
    def __getattr__(self, n):
        if n.startswith("__"): raise AttributeError(n)
        return _Inert()

class _StubLoader(importlib.abc.Loader):
    def create_module(self, spec):
        m = types.ModuleType(spec.name)
        m.__file__ = spec.origin
        def ga(n):
            if n.startswith("__"): raise AttributeError(n)
            return _Inert if n[:1].isupper() else _Inert()
        m.__getattr__ = ga
        return m
    def exec_module(self, module): pass

class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if not name.startswith("megatron."):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or not spec.origin or not spec.origin.endswith(".py") or spec.submodule_search_locations:
            return None
        src = open(spec.origin, encoding="utf-8").read()
        if "import triton" in src or "from triton" in src:
            return importlib.machinery.ModuleSpec(name, _StubLoader(), origin=spec.origin)
        return None

sys.meta_path.insert(0, _Finder())
"""

_RAW = """
import json, os, sys, time
texts = json.load(open(sys.argv[1]))
from tokenizers import BertWordPieceTokenizer
tok = BertWordPieceTokenizer(sys.argv[2], lowercase=True)
out = {}
for name in ("encode_batch", "encode_batch_fast"):
    fn = getattr(tok._tokenizer, name)
    best = None
    for _ in range(2):
        t0 = time.perf_counter(); c0 = time.process_time(); n = 0
        for i in range(0, len(texts), 64):
            n += sum(len(e.ids) for e in fn(texts[i:i + 64], add_special_tokens=False))
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        best = (dt, cpu) if best is None else (min(best[0], dt), min(best[1], cpu))
    out[name] = {"seconds": best[0], "cpu": best[1], "tokens": n}
print(json.dumps(out))
"""


def _run(cmd: list[str], env: dict | None = None, cwd: str | None = None) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the command and all its processes)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise RuntimeError(f"command failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr[-3000:]}")
    return dt, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _best(fn, repeat: int) -> tuple[float, float]:
    runs = [fn() for _ in range(repeat)]
    return min(r[0] for r in runs), min(r[1] for r in runs)


def _select(files: list[Path], max_bytes: int) -> list[Path]:
    out, total = [], 0
    for f in files:
        if total >= max_bytes:
            break
        out.append(f)
        total += f.stat().st_size
    return out


def main(argv: list[str] | None = None) -> int:
    """The command line; bad input is one line and exit 2 (common.error_exit.run_entry)."""
    from common.error_exit import run_entry

    return run_entry("benchmarks.preprocess_throughput", _main, argv)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="benchmarks.preprocess_throughput", description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", default=str(REPO.parent / "shared" / "corpus"))
    ap.add_argument("--vocab-file", default=None, help="default: CORPUS/vocab/bert-base-uncased/vocab.txt")
    ap.add_argument("--megatron-repo", default=None, help="checkout of NVIDIA/Megatron-LM (tools/preprocess_data.py)")
    ap.add_argument("--max-mb", type=float, default=12.0, help="MB of books plus MB of WikiExtractor files, each")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--output-json", default=str(REPO / "out" / "bench" / "preprocess_throughput.json"))
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument("--repeat", type=int, default=2, help="best of N for every timed command")
    return ap


@dataclass
class _Bench:
    """One benchmark run's settings and scratch: the flags, the vocab, the temp dir, the interpreter and its env."""

    a: argparse.Namespace
    vocab: Path
    tmp: Path
    py: str = sys.executable
    env: dict = field(default_factory=lambda: dict(os.environ, PYTHONPATH=str(REPO), TOKENIZERS_PARALLELISM="false"))


def _inputs(a: argparse.Namespace) -> tuple[Path, list[Path], list[Path]]:
    """The vocab and the books and WikiExtractor files to time, checked before minutes of timings (one line each
    when something is missing)."""
    from common.errors import UserError
    from common.outputs import check_file_writable
    from data_pipeline.tokenization import build_tokenizer

    corpus = Path(a.corpus)
    vocab = Path(a.vocab_file or corpus / "vocab" / "bert-base-uncased" / "vocab.txt")
    build_tokenizer("BertWordPieceLowerCase", str(vocab))
    if a.megatron_repo and not (Path(a.megatron_repo) / "tools" / "preprocess_data.py").is_file():
        raise UserError(
            f"--megatron-repo {a.megatron_repo}: no tools/preprocess_data.py there; give a checkout of "
            "NVIDIA/Megatron-LM"
        )
    check_file_writable(a.output_json, "--output-json")
    books = _select(sorted((corpus / "books").glob("pg*.txt")), int(a.max_mb * 1e6))
    wiki = _select(sorted((corpus / "wiki" / "wikiextractor").rglob("wiki_*")), int(a.max_mb * 1e6))
    if not books + wiki:
        raise UserError(f"--corpus {corpus}: no books/pg*.txt nor wiki/wikiextractor/**/wiki_* files there")
    return vocab, books, wiki


def _write_texts(inputs: list[Path], tmp: Path) -> list[str]:
    """The cleaned documents, as our readers produce them: the raw tokenizer's input (texts.json), the shared
    jsonl for our pipeline and Megatron's (docs.jsonl), and a one-document jsonl for start-up costs."""
    from data_pipeline.encode import doc_text
    from data_pipeline.readers import BadInputLog, read_documents

    texts = []
    for f in inputs:
        for d in read_documents(str(f), "auto", ["text"], BadInputLog()):
            t = doc_text(d.texts["text"], d.kind)
            if t:
                texts.append(t)
    (tmp / "texts.json").write_text(json.dumps(texts))
    with open(tmp / "docs.jsonl", "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")
    with open(tmp / "one.jsonl", "w", encoding="utf-8") as f:
        f.write(json.dumps({"text": texts[0][:2000]}) + "\n")
    return texts


def _entry(wall: float, cpu: float, start: float, start_cpu: float, tokens: int, mb: float) -> dict:
    """One timed command's row: ``net`` subtracts the tool's start-up cost (``start_cpu``: its CPU share)."""
    return {
        "wall_s": wall,
        "net_s": wall - start,
        "cpu_s": cpu,
        "net_cpu_s": cpu - start_cpu,
        "tokens": tokens,
        "mb": mb,
    }


def _time_raw_tokenizer(b: _Bench, text_mb: float, runs: dict) -> None:
    """The tokenizer backend alone on the cleaned texts, per thread count (a fresh subprocess each)."""
    for threads in b.a.workers:
        tenv = dict(
            b.env,
            TOKENIZERS_PARALLELISM="true" if threads > 1 else "false",
            RAYON_NUM_THREADS=str(threads),
            RAYON_RS_NUM_CPUS=str(threads),
        )
        r = subprocess.run(
            [b.py, "-c", _RAW, str(b.tmp / "texts.json"), str(b.vocab)],
            env=tenv,
            capture_output=True,
            text=True,
            check=True,
        )
        for name, v in json.loads(r.stdout).items():
            runs[f"raw {name} x{threads}"] = {
                "net_s": v["seconds"],
                "net_cpu_s": v["cpu"],
                "tokens": v["tokens"],
                "mb": text_mb,
            }
        print(f"raw tokenizer x{threads}: done", flush=True)


def _time_ours(b: _Bench, inputs: list[Path], in_mb: float, jsonl_mb: float, tokens: int, results: dict) -> None:
    """data_pipeline.preprocess on the raw files (document and sentence level) and on the shared jsonl."""

    def ours(inp: list[str], prefix: str, workers: int, extra: list[str]) -> tuple[float, float]:
        cmd = [
            b.py,
            "-m",
            "data_pipeline.preprocess",
            "--input",
            *inp,
            "--output-prefix",
            str(b.tmp / prefix),
            "--tokenizer-type",
            "BertWordPieceLowerCase",
            "--vocab-file",
            str(b.vocab),
            "--workers",
            str(workers),
            "--no-progress",
            "--overwrite",  # each repeat rewrites the same shards
            *extra,
        ]
        return _best(lambda: _run(cmd, env=b.env, cwd=str(REPO)), b.a.repeat)

    start, start_cpu = ours([str(b.tmp / "one.jsonl")], "startup", 1, [])
    results["startup_s"] = {"ours": start}
    for level, extra in (("document", []), ("sentence", ["--split-sentences"])):
        for w in b.a.workers:
            wall, cpu = ours([str(f) for f in inputs], f"raw_{level}_{w}", w, extra)
            results["runs"][f"ours raw files {level} w{w}"] = _entry(wall, cpu, start, start_cpu * w, tokens, in_mb)
            print(f"ours {level} w{w}: {wall:.1f}s wall, {cpu:.1f}s CPU", flush=True)
    for w in b.a.workers:
        wall, cpu = ours([str(b.tmp / "docs.jsonl")], f"jsonl_{w}", w, [])
        results["runs"][f"ours jsonl document w{w}"] = _entry(wall, cpu, start, start_cpu * w, tokens, jsonl_mb)


def _time_megatron(b: _Bench, jsonl_mb: float, tokens: int, results: dict) -> None:
    """Megatron-LM's tools/preprocess_data.py on the same jsonl (through the import shim), and whether its
    shards equal ours byte for byte."""
    tmp, vocab = b.tmp, b.vocab
    shim = tmp / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(_SHIM)
    hub = tmp / "mwork" / "bert-large-uncased"
    hub.mkdir(parents=True)
    shutil.copy(vocab, hub / "vocab.txt")
    (hub / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    (hub / "config.json").write_text(json.dumps({"model_type": "bert"}))
    menv = dict(
        os.environ, PYTHONPATH=f"{b.a.megatron_repo}:{shim}", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false"
    )
    script = str(Path(b.a.megatron_repo) / "tools" / "preprocess_data.py")

    def megatron(inp: Path, prefix: str, workers: int) -> tuple[float, float]:
        cmd = [
            b.py,
            script,
            "--input",
            str(inp),
            "--output-prefix",
            str(tmp / prefix),
            "--tokenizer-type",
            "BertWordPieceLowerCase",
            "--vocab-file",
            str(vocab),
            "--tokenizer-hf-no-include-special-tokens",
            "--workers",
            str(workers),
        ]
        return _best(lambda: _run(cmd, env=menv, cwd=str(tmp / "mwork")), b.a.repeat)

    start, start_cpu = megatron(tmp / "one.jsonl", "mstartup", 1)
    results["startup_s"]["megatron"] = start
    for w in b.a.workers:
        wall, cpu = megatron(tmp / "docs.jsonl", f"megatron_{w}", w)
        row = results["runs"][f"megatron jsonl document w{w}"] = _entry(wall, cpu, start, start_cpu, tokens, jsonl_mb)
        same = all(
            (tmp / f"megatron_{w}_text_document{e}").read_bytes() == (tmp / f"jsonl_{w}_text_document{e}").read_bytes()
            for e in (".bin", ".idx")
        )
        row["identical_to_ours"] = same
        print(f"megatron w{w}: {wall:.1f}s (output identical to ours: {same})", flush=True)


def _print_table(runs: dict) -> None:
    """Each run's wall, net and CPU seconds and rates (the rates are added to its row)."""
    print(f"\n{'run':36s} {'wall s':>7s} {'net s':>7s} {'CPU s':>7s} {'MB/s':>6s} {'tokens/s':>9s} {'tok/CPU-s':>10s}")
    for name, r in runs.items():
        r["mb_per_s"] = r["mb"] / r["net_s"]
        r["tokens_per_s"] = r["tokens"] / r["net_s"]
        r["tokens_per_cpu_s"] = r["tokens"] / r["net_cpu_s"]
        wall = f"{r['wall_s']:.1f}" if "wall_s" in r else "-"
        print(
            f"{name:36s} {wall:>7s} {r['net_s']:7.2f} {r['net_cpu_s']:7.2f} {r['mb_per_s']:6.2f} "
            f"{r['tokens_per_s']:9,.0f} {r['tokens_per_cpu_s']:10,.0f}"
        )


def _ratios(runs: dict, workers: list[int]) -> dict[str, float]:
    """Ours against the raw tokenizer and against Megatron's script, on net wall time and per CPU-second."""
    ratios = {}
    for w in workers:
        for base in ("encode_batch", "encode_batch_fast"):
            raw = runs[f"raw {base} x{w}"]
            for level in ("document", "sentence"):
                p = runs[f"ours raw files {level} w{w}"]
                ratios[f"ours {level} w{w} / raw {base} x{w} (wall)"] = p["tokens_per_s"] / raw["tokens_per_s"]
                ratios[f"ours {level} w{w} / raw {base} (per CPU-s)"] = p["tokens_per_cpu_s"] / raw["tokens_per_cpu_s"]
        if f"megatron jsonl document w{w}" in runs:
            m, o = runs[f"megatron jsonl document w{w}"], runs[f"ours jsonl document w{w}"]
            ratios[f"ours / megatron jsonl document w{w} (net wall)"] = o["tokens_per_s"] / m["tokens_per_s"]
            ratios[f"ours / megatron jsonl document w{w} (whole command)"] = m["wall_s"] / o["wall_s"]
            ratios[f"ours / megatron jsonl document w{w} (per CPU-s)"] = o["tokens_per_cpu_s"] / m["tokens_per_cpu_s"]
    return ratios


def _main(argv: list[str]) -> int:
    """Check the inputs, write the cleaned texts, time the raw tokenizer, our pipeline and (with --megatron-repo)
    Megatron's script, print the table and ratios, write the JSON."""
    from common.errors import write_errors
    from common.outputs import atomic_file

    a = _parser().parse_args(argv)
    vocab, books, wiki = _inputs(a)
    inputs = books + wiki
    in_bytes = sum(f.stat().st_size for f in inputs)
    b = _Bench(a, vocab, Path(tempfile.mkdtemp(prefix="bench_preprocess_")))
    texts = _write_texts(inputs, b.tmp)
    text_bytes = sum(len(t.encode("utf-8")) for t in texts)
    jsonl_bytes = (b.tmp / "docs.jsonl").stat().st_size
    print(
        f"input: {len(books)} books + {len(wiki)} WikiExtractor files = {in_bytes / 1e6:.1f} MB raw, "
        f"{len(texts)} documents, {text_bytes / 1e6:.1f} MB of cleaned text",
        flush=True,
    )
    results: dict = {
        "machine": "2-core CPU dev box, shared, no GPU",
        "input_files": [str(f) for f in inputs],
        "input_mb": in_bytes / 1e6,
        "text_mb": text_bytes / 1e6,
        "documents": len(texts),
        "runs": {},
    }
    _time_raw_tokenizer(b, text_bytes / 1e6, results["runs"])
    tokens = results["runs"][f"raw encode_batch x{a.workers[0]}"]["tokens"]
    _time_ours(b, inputs, in_bytes / 1e6, jsonl_bytes / 1e6, tokens, results)
    if a.megatron_repo:
        _time_megatron(b, jsonl_bytes / 1e6, tokens, results)
    _print_table(results["runs"])
    print("\nratios (tokens/s on net wall time; and tokens per CPU-second, which a shared box does not distort):")
    ratios = _ratios(results["runs"], a.workers)
    for k, v in ratios.items():
        print(f"  {k:62s} {v:6.2f}")
    results["ratios"] = ratios
    with write_errors(f"--output-json {a.output_json}", Path(a.output_json).parent), atomic_file(a.output_json) as t:
        t.write_text(json.dumps(results, indent=1))
    print(f"\nwritten {a.output_json}")
    if not a.keep:
        shutil.rmtree(b.tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
