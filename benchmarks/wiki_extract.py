"""Wikipedia extraction: our whole dump -> shards command against WikiExtractor's extraction, speed and quality.

    .venv/bin/python -m benchmarks.wiki_extract [--dump DUMP.bz2] [--repeat 3] [--diff-pages 5]

Speed, side by side in one run, on the same dump, the two commands in turn (A B A B ...), each a fresh process:
  * ours: ``python -m data_pipeline.preprocess --input DUMP --split-sentences --workers 1`` (BERT uncased vocab):
    read, wikitext -> text, sentences, WordPiece ids, shards; one core (``--workers 1`` runs in-process);
  * WikiExtractor: ``python -m wikiextractor.WikiExtractor --processes 1 -o OUT DUMP`` (text only, no tokens;
    it still runs a reader, one extractor and a writer process).
Both run pinned to one core (``--pin``; WikiExtractor's reader, extractor and writer processes share it), so wall
time is all the CPU time either spends: MB/s of bz2 per core = dump MB / wall (median, and the ratio pair by
pair). Also: our reader's own rate (what one rank's parent can feed) and, from these rates, projected hours for
the full English dump.

Quality, on the pages both tools keep (matched by title): the share of lines with residue (``{{``, ``}}``,
``[[``, ``<ref``, table pipes), words kept, and a few pages written side by side (``--diff-pages``) to be read.

WikiExtractor is not a dependency of the project (it is AGPL): ``pip install wikiextractor==3.1.0`` into the
venv (or onto PYTHONPATH) for this benchmark only. Without it the script times and measures ours alone and says
so. Runs in about a minute on the shared 106-article dump.
"""

from __future__ import annotations

import argparse
import ast
import html
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CORPUS = REPO.parent / "shared" / "corpus"
DEFAULT_DUMP = CORPUS / "wiki" / "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
DEFAULT_VOCAB = CORPUS / "vocab" / "bert-base-uncased" / "vocab.txt"

#: a line with any of these is markup that survived extraction
RESIDUE = re.compile(r"\{\{|\}\}|\[\[|<ref|^\s*(\{\||\|\}|\|-|\||!)|\|\||!!", re.IGNORECASE)
_DOC = re.compile(r'<doc id="[^"]*" url="[^"]*" title="([^"]*)">\n(.*?)\n</doc>', re.DOTALL)


def _run(cmd: list[str], env: dict, cpu: int | None = None) -> tuple[float, float, str]:
    """(wall s, CPU s of the processes it reaped, stderr); ``cpu``: the command and all its processes on that
    one core (then wall time is the CPU time of all of them, reaped or not)."""
    pin = (lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None else None
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    p = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, preexec_fn=pin)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode == 2:  # the command refused its input in one line (common.errors): pass that line on
        from common.errors import UserError

        line = next((ln for ln in reversed(p.stderr.splitlines()) if " error: " in ln), p.stderr.strip()[-300:])
        raise UserError(f"{cmd[2] if cmd[1] == '-m' else cmd[0]}: {line.split(' error: ', 1)[-1]}")
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} ... failed ({p.returncode}):\n{p.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, p.stderr


def has_wikiextractor(env: dict) -> str | None:
    """WikiExtractor's version when the interpreter finds it, else None."""
    p = subprocess.run(
        [sys.executable, "-c", "import importlib.metadata as m; print(m.version('wikiextractor'))"],
        env=env,
        capture_output=True,
        text=True,
    )
    return p.stdout.strip() if p.returncode == 0 else None


def our_pages(dump: Path) -> dict[str, str]:
    """Title -> our cleaned text (what the shards are made of, before sentences and tokens)."""
    from data_pipeline.encode import doc_text
    from data_pipeline.readers import BadInputLog, read_mediawiki

    out = {}
    for d in read_mediawiki(str(dump), ["text"], BadInputLog()):
        title = ast.literal_eval(d.where[len("page ") : d.where.rindex(" (#")])  # where = "page 'T' (#n)"
        out[title] = doc_text(d.texts["text"], d.kind)
    return out


def wikiextractor_pages(out_dir: Path) -> dict[str, str]:
    """Title -> WikiExtractor's text (its first line, the title repeated, dropped)."""
    pages = {}
    for f in sorted(out_dir.rglob("wiki_*")):
        for title, body in _DOC.findall(f.read_text(encoding="utf-8")):
            title = html.unescape(title)
            lines = body.split("\n")
            if lines and lines[0].strip() == title.strip():
                lines = lines[1:]
            pages[title] = "\n".join(line for line in lines if line.strip())
    return pages


def quality(pages: dict[str, str]) -> dict:
    lines = [ln for text in pages.values() for ln in text.split("\n") if ln.strip()]
    bad = sum(1 for ln in lines if RESIDUE.search(ln))
    return {
        "pages": len(pages),
        "lines": len(lines),
        "residue_lines": bad,
        "residue_rate": bad / max(1, len(lines)),
        "words": sum(len(t.split()) for t in pages.values()),
    }


def reader_rate(dump: Path) -> float:
    """MB/s of bz2 (per CPU second) of the reader alone: what one rank's parent can feed its workers."""
    from data_pipeline.readers import BadInputLog, read_mediawiki

    t = time.process_time()
    for _ in read_mediawiki(str(dump), ["text"], BadInputLog()):
        pass
    return dump.stat().st_size / 1e6 / (time.process_time() - t)


#: enwiki pages-articles as its split files (pages-articles1.xml-p...bz2 ...): MPI ranks take whole files
FULL_DUMP_MB, FULL_DUMP_FILES = 22_000, 27


def projection(report: dict, reader: float) -> dict:
    """Hours for the full enwiki dump at the measured rates per CPU second (the 1-process runs above, start-up
    included; per CPU second, so that other load on a shared box does not enter; WikiExtractor's may be flattered
    by processes it did not reap), for 2, 16 and 64 cores per node on 1 and 4 nodes. Model: every core works at
    the 1-process rate; one reader per rank feeds at most ``reader`` MB/s, so a node runs enough ranks to feed
    its cores (never more than there are files); a file is one rank's, so the run lasts at least one file at its
    rank's rate."""
    out = {}
    print(f"\nprojected hours, {FULL_DUMP_MB / 1000:.0f} GB bz2 in {FULL_DUMP_FILES} even files:")
    print(f"{'cores/node':>10}{'nodes':>7}" + "".join(f"{n:>16}" for n in report["timing"]))
    for cores in (2, 16, 64):
        for nodes in (1, 4):
            row = {}
            for name, t in report["timing"].items():
                rate = t["mb_cpu_s"]
                ranks = min(FULL_DUMP_FILES, nodes * max(1, -(-cores * rate // reader)))
                per_rank = min(reader, cores * nodes / ranks * rate)
                file_mb = FULL_DUMP_MB / FULL_DUMP_FILES
                rounds = -(-FULL_DUMP_FILES // ranks)
                seconds = max(FULL_DUMP_MB / (cores * nodes * rate), rounds * file_mb / per_rank)
                row[name] = seconds / 3600
            out[f"{cores}x{nodes}"] = row
            print(f"{cores:>10}{nodes:>7}" + "".join(f"{h:>16.2f}" for h in row.values()))
    return out


def main(argv: list[str] | None = None) -> int:
    """The command line; bad input is one line and exit 2 (common.error_exit.run_entry)."""
    from common.error_exit import run_entry

    return run_entry("benchmarks.wiki_extract", _main, argv)


def _main(argv: list[str]) -> int:
    from common.errors import UserError
    from common.outputs import check_dir_writable

    ap = argparse.ArgumentParser(prog="benchmarks.wiki_extract", description=__doc__.split("\n\n")[0])
    ap.add_argument("--dump", default=str(DEFAULT_DUMP), help="a pages-articles .xml.bz2")
    ap.add_argument("--vocab-file", default=str(DEFAULT_VOCAB))
    ap.add_argument("--repeat", type=int, default=3, help="timed runs of each command (after one warm-up each)")
    ap.add_argument("--diff-pages", type=int, default=5, help="pages written side by side for reading")
    ap.add_argument(
        "--pin",
        type=int,
        default=max(os.sched_getaffinity(0)),
        help="run both commands on this one core (default: the highest this process may use); -1: not pinned",
    )
    ap.add_argument("--output-dir", default=str(REPO / "out" / "bench" / "wiki_extract"))
    a = ap.parse_args(argv)

    dump = Path(a.dump)
    if not dump.is_file():
        raise UserError(f"--dump {dump}: no such file (the shared corpus: shared/corpus/SOURCES.md)")
    out_dir = Path(a.output_dir)
    check_dir_writable(out_dir, "--output-dir")
    tmp = Path(tempfile.mkdtemp(prefix="bench_wiki_"))
    env = dict(os.environ)
    bz2_mb = dump.stat().st_size / 1e6
    version = has_wikiextractor(env)
    print(f"dump {dump.name}: {bz2_mb:.2f} MB bz2")
    print(f"WikiExtractor: {version or 'not installed (pip install wikiextractor==3.1.0): ours alone'}")
    cpu = a.pin if a.pin >= 0 else None
    print(f"both commands pinned to core {cpu} (MB/s per core = MB / wall)" if cpu is not None else "not pinned")

    py = sys.executable
    ours = [py, "-m", "data_pipeline.preprocess", "--input", str(dump), "--output-prefix", str(tmp / "ours" / "wiki")]
    ours += ["--tokenizer-type", "BertWordPieceLowerCase", "--vocab-file", a.vocab_file]
    ours += ["--split-sentences", "--workers", "1", "--no-progress", "--overwrite"]  # repeats rewrite the shards
    theirs = [py, "-m", "wikiextractor.WikiExtractor", "--processes", "1", "-o", str(tmp / "we"), str(dump)]

    runs: dict[str, list[tuple[float, float]]] = {"ours": [], "wikiextractor": []}
    we_log = ""
    for r in range(a.repeat + 1):  # run 0 warms the page cache and the imports, not counted
        res = _run(ours, env, cpu)
        if r:
            runs["ours"].append(res[:2])
        if version:
            res = _run(theirs, env, cpu)
            we_log = res[2]
            if r:
                runs["wikiextractor"].append(res[:2])

    report: dict = {"dump": str(dump), "bz2_mb": bz2_mb, "wikiextractor": version, "repeat": a.repeat, "pin": cpu}
    report["timing"] = {}
    print(f"\n{'command':<16}{'wall s (median)':>17}{'CPU s (median)':>16}{'MB/s bz2 per core':>19}{'per CPU s':>11}")
    for name, rs in runs.items():
        if not rs:
            continue
        wall = statistics.median(w for w, _ in rs)
        cpu = statistics.median(c for _, c in rs)
        t = {"wall_s": [w for w, _ in rs], "cpu_s": [c for _, c in rs], "mb_s": bz2_mb / wall, "mb_cpu_s": bz2_mb / cpu}
        report["timing"][name] = t
        print(f"{name:<16}{wall:>17.2f}{cpu:>16.2f}{bz2_mb / wall:>19.3f}{bz2_mb / cpu:>11.3f}")
    if version:
        ratios = [o[0] / w[0] for o, w in zip(runs["ours"], runs["wikiextractor"])]
        cpu_ratios = [o[1] / w[1] for o, w in zip(runs["ours"], runs["wikiextractor"])]
        report["wall_ratio"] = ratios
        report["cpu_ratio"] = cpu_ratios
        print(f"ours / WikiExtractor, wall pair by pair: median {statistics.median(ratios):.2f} ", end="")
        print(f"(min {min(ratios):.2f}, max {max(ratios):.2f}); CPU: median {statistics.median(cpu_ratios):.2f}")
        m = re.search(r"extraction of (\d+) articles in ([\d.]+)s", we_log)
        if m:
            print(f"WikiExtractor's own log, last run: {m.group(1)} articles extracted in {m.group(2)} s")

    reader = reader_rate(dump)
    report["reader_mb_s"] = reader
    print(f"\nour reader alone (bz2 + XML pages, the parent's share): {reader:.2f} MB/s of bz2 (CPU time)")
    if report["timing"]:
        report["projection"] = projection(report, reader)

    ours_pages = our_pages(dump)
    report["quality"] = {"ours_all": quality(ours_pages)}
    if not version:
        q = report["quality"]["ours_all"]
        print(f"\nours: {q['pages']} pages, {q['lines']} lines, {q['residue_lines']} with residue", end="")
        print(f", {q['words']:,} words")
    if version:
        we_pages = wikiextractor_pages(tmp / "we")
        common = sorted(set(ours_pages) & set(we_pages))
        q_ours = quality({t: ours_pages[t] for t in common})
        q_we = quality({t: we_pages[t] for t in common})
        report["quality"].update(common_pages=len(common), ours=q_ours, wikiextractor=q_we)
        kept = f"ours {len(ours_pages)}, WikiExtractor {len(we_pages)}"
        print(f"\nquality on the {len(common)} pages both keep ({kept}):")
        print(f"{'':<16}{'lines':>9}{'residue':>9}{'rate':>9}{'words':>11}")
        for name, q in (("ours", q_ours), ("wikiextractor", q_we)):
            print(f"{name:<16}{q['lines']:>9}{q['residue_lines']:>9}{q['residue_rate']:>9.2%}{q['words']:>11,}")
        step = max(1, len(common) // max(1, a.diff_pages))
        for t in common[::step][: a.diff_pages]:
            name = re.sub(r"[^A-Za-z0-9]+", "_", t)[:40]
            (out_dir / f"{name}.ours.txt").write_text(ours_pages[t] + "\n", encoding="utf-8")
            (out_dir / f"{name}.wikiextractor.txt").write_text(we_pages[t] + "\n", encoding="utf-8")
        print(f"{min(a.diff_pages, len(common))} pages side by side in {out_dir} (diff -y them)")
        examples = [(t, ln) for t in common for ln in ours_pages[t].split("\n") if RESIDUE.search(ln)]
        report["ours_residue_examples"] = [f"{t}: {ln[:160]}" for t, ln in examples[:20]]
    (out_dir / "report.json").write_text(json.dumps(report, indent=1))
    print(f"report: {out_dir / 'report.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
