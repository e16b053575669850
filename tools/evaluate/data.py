"""Readers: each task's train and dev sets from the layouts users have on disk, as the canonical examples of
tools/evaluate/examples.py. Nothing is downloaded.

Layouts (docs/evaluation_data.md has the table): GLUE's official TSV directories (and the probe tasks, in MRPC's and
SST-2's TSV layout), XNLI's xnli.{dev,test}.tsv, SWAG's CSV (swagaf), SQuAD's official JSON v1.1 / v2.0, MRQA's
jsonl(.gz), and every task's Hugging Face ``datasets`` export (the Hub's parquet files, ``save_to_disk`` directories),
read with pyarrow (the Arrow files ``datasets`` writes), so ``datasets`` is not needed at run time. A task whose
files are not found, or a file that cannot be read, is a :class:`DataError` naming the file, the line and what to
do."""

from __future__ import annotations

import csv
import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from common.errors import UserError
from tools.evaluate.examples import ChoiceExample, Example, QAExample, TextExample
from tools.evaluate.tasks import MRQA_DATASETS, Task, get_task


class DataError(UserError, ValueError):
    """A task's data is missing or cannot be read; the message names the file (and line) and what to do."""


# ------------------------------------------------------------------------------------------------ layouts (data)
@dataclass(frozen=True)
class TsvLayout:
    """One GLUE-style TSV directory: which columns hold the texts and the label."""

    dirs: tuple[str, ...]
    """Directory names under --data-dir (GLUE's download script's names; matched case-insensitively)."""
    text_a: str | int
    """Header name (or 0-based column index for header-less files) of the first sentence."""
    text_b: str | int | None
    """Of the second sentence; None for single-sentence tasks."""
    label: str | int
    """Of the label: an index ("0", "1"), a label name (MNLI's "entailment"), or a float (STS-B)."""
    header: bool = True
    """False: no header line (CoLA's train/dev)."""
    files: tuple[tuple[str, str], ...] = (("train", "train.tsv"), ("validation", "dev.tsv"))
    """split -> file name in the directory."""
    example_layout: str = ""
    """The GLUE task whose layout this is (for the docs), e.g. probe_pair: "MRPC"."""

    def file(self, split: str) -> str | None:
        return dict(self.files).get(split)


_MNLI_FILES = (("train", "train.tsv"), ("validation_matched", "dev_matched.tsv"),
               ("validation_mismatched", "dev_mismatched.tsv"))  # fmt: skip
_MRPC = dict(text_a="#1 String", text_b="#2 String", label="Quality")
_SST2 = dict(text_a="sentence", text_b=None, label="label")

TSV_LAYOUTS: dict[str, TsvLayout] = {
    "cola": TsvLayout(("CoLA",), 3, None, 1, header=False),
    "sst2": TsvLayout(("SST-2",), **_SST2),
    "mrpc": TsvLayout(("MRPC",), **_MRPC),
    "stsb": TsvLayout(("STS-B",), "sentence1", "sentence2", "score"),
    "qqp": TsvLayout(("QQP",), "question1", "question2", "is_duplicate"),
    "mnli": TsvLayout(("MNLI",), "sentence1", "sentence2", "gold_label", files=_MNLI_FILES),
    "qnli": TsvLayout(("QNLI",), "question", "sentence", "label"),
    "rte": TsvLayout(("RTE",), "sentence1", "sentence2", "label"),
    "wnli": TsvLayout(("WNLI",), "sentence1", "sentence2", "label"),
    "probe_pair": TsvLayout(("probe_pair",), **_MRPC, example_layout="MRPC"),
    "probe_single": TsvLayout(("probe_single",), **_SST2, example_layout="SST-2"),
}
"""GLUE-format TSV directories by task."""

XNLI_DIRS = ("XNLI", "XNLI-1.0")
XNLI_FILES = {"validation": "xnli.dev.tsv", "test": "xnli.test.tsv"}
XNLI_LANGUAGES = ("ar", "bg", "de", "el", "en", "es", "fr", "hi", "ru", "sw", "th", "tr", "ur", "vi", "zh")

SWAG_DIRS = ("SWAG", "swagaf", "swagaf/data")
SWAG_FILES = {"train": ("train.csv",), "validation": ("val.csv", "validation.csv", "dev.csv")}

SQUAD_DIRS = ("SQuAD", "squad", "SQuAD1.1", "SQuAD2.0", "squad1", "squad2")
SQUAD_FILES = {"squad1": {"train": "train-v1.1.json", "validation": "dev-v1.1.json"},
               "squad2": {"train": "train-v2.0.json", "validation": "dev-v2.0.json"}}  # fmt: skip

MRQA_DIRS = (".", "MRQA", "mrqa")
MRQA_SPLIT_DIRS = {"train": ("train",), "validation": ("dev", "validation")}
MRQA_HF_DIRS = ("mrqa/plain_text", "mrqa/default", "mrqa")
MRQA_ALIASES = {"mrqa_triviaqa": ("TriviaQA",), "mrqa_naturalquestions": ("NaturalQuestions",)}
"""Other file names seen for MRQA's files (download scripts that rename them), after the released one."""

HF_DIRS: dict[str, tuple[str, ...]] = {
    **{t: (f"glue/{t}", t) for t in ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli")},
    "probe_pair": ("probe_pair",),
    "probe_single": ("probe_single",),
    "swag": ("swag/regular", "swag"),
    "squad1": ("squad/plain_text", "squad"),
    "squad2": ("squad_v2/squad_v2", "squad_v2"),
}
"""Hugging Face ``datasets`` exports by task: directories (under --data-dir) holding the Hub's
``<split>-*.parquet`` / ``<split>/*.parquet`` files or a ``save_to_disk`` directory."""

_HF_PAIRS = (
    ("sentence1", "sentence2"),
    ("question1", "question2"),
    ("premise", "hypothesis"),
    ("question", "sentence"),
)


# --------------------------------------------------------------------------------------------------- entry point
def splits(task: str | Task) -> tuple[str, ...]:
    """The splits :func:`load_split` reads for ``task``: "train", its dev splits, and XNLI's "test" and
    per-language "validation_<lang>" / "test_<lang>"."""
    t = get_task(task)
    extra: tuple[str, ...] = ()
    if t.name == "xnli":
        extra = ("test",) + tuple(f"{s}_{lang}" for s in ("validation", "test") for lang in XNLI_LANGUAGES)
    return ("train",) + t.eval_splits + extra


def load_split(task: str | Task, data_dir: str | Path, split: str, limit: int | None = None) -> list[Example]:
    """The examples of one split of ``task``, found under ``data_dir`` in any supported layout (file order;
    ``limit``: the first ``limit`` only). Missing files or a malformed file raise :class:`DataError`."""
    t = get_task(task)
    root = Path(data_dir)
    if not root.is_dir():
        raise DataError(f"--data-dir {root}: no such directory; give the directory that holds the task data")
    if split not in splits(t):
        raise DataError(f"task {t.name} has no split {split!r}; choose one of: {', '.join(splits(t))}")
    if limit is not None and limit < 1:
        raise DataError(f"limit {limit}: must be at least 1 (or None for every example)")
    if t.name == "xnli":
        examples = _load_xnli(t, root, split, limit)
    elif t.suite == "mrqa":
        examples = _load_mrqa(t, root, split, limit)
    else:
        examples = _load_native(t, root, split, limit)
        if examples is None:
            examples = _load_hf(t, root, split, limit)
    return examples


# ------------------------------------------------------------------------------------------------------ locating
def _subdirs(root: Path, names: Iterable[str]) -> list[Path]:
    """Existing directories ``root/name`` (each path component matched case-insensitively), in ``names`` order."""
    found: list[Path] = []
    for name in names:
        cur: Path | None = root
        for part in Path(name).parts:
            if cur is None:
                break
            exact = cur / part
            if exact.is_dir():
                cur = exact
                continue
            try:
                cur = next((p for p in sorted(cur.iterdir()) if p.is_dir() and p.name.lower() == part.lower()), None)
            except OSError:
                cur = None
        if cur is not None and cur.is_dir() and cur not in found:
            found.append(cur)
    return found


def _task_dirs(root: Path, names: Iterable[str]) -> list[Path]:
    names = tuple(names)
    dirs = _subdirs(root, names)
    if root.name.lower() in {Path(n).name.lower() for n in names} and root not in dirs:
        dirs.append(root)  # --data-dir is the task's own directory
    return dirs


def _missing(t: Task, root: Path, split: str) -> DataError:
    return DataError(
        f"task {t.name}, split {split}: no data found under {root} (looked for "
        f"{'; '.join(layouts_text(t, split))}); put the task's files there in one of the layouts of "
        "docs/evaluation_data.md"
    )


# --------------------------------------------------------------------------------------------- native formats
def _nonempty(examples: list[Example], src: Path, what: str = "examples") -> list[Example]:
    if not examples:
        raise DataError(f"{src}: holds no {what}; re-extract or re-export it")
    return examples


def _load_native(t: Task, root: Path, split: str, limit: int | None) -> list[Example] | None:
    """The task's own official format, or None when its files are not there (the caller tries HF exports)."""
    if t.name in TSV_LAYOUTS:
        lay = TSV_LAYOUTS[t.name]
        for d in _task_dirs(root, lay.dirs + (t.name,)):
            path = d / lay.file(split)
            if path.is_file():
                return _read_glue_tsv(t, lay, path, split, limit)
    elif t.name == "swag":
        for d in _task_dirs(root, SWAG_DIRS + ("swag",)):
            for name in SWAG_FILES[split]:
                if (d / name).is_file():
                    return _read_swag_csv(d / name, split, limit)
    elif t.name in SQUAD_FILES:
        name = SQUAD_FILES[t.name][split]
        for d in [root, *_task_dirs(root, SQUAD_DIRS)]:
            if (d / name).is_file():
                return _read_squad_json(t, d / name, limit)
    return None


def _open_text(path: Path):
    try:
        if path.suffix == ".gz":
            return gzip.open(path, "rt", encoding="utf-8-sig", newline="")
        return path.open("r", encoding="utf-8-sig", newline="")
    except OSError as e:
        raise DataError(f"{path}: cannot open ({e.strerror or e}); check the file's permissions") from e


def _rows(path: Path, reader: Callable[[Any], Iterator[list[str]]]) -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) of a delimited text file; an undecodable byte is a DataError naming the line."""
    with _open_text(path) as f:
        it = reader(f)
        while True:
            try:
                row = next(it)
            except StopIteration:
                return
            except UnicodeDecodeError as e:
                raise DataError(f"{path}: not UTF-8 text ({e.reason}); re-extract the file") from e
            except csv.Error as e:
                raise DataError(f"{path}:{getattr(it, 'line_num', '?')}: {e}; re-extract the file") from e
            yield it.line_num, row


def _tsv(f) -> Any:
    # GLUE's TSVs contain stray double quotes (MNLI, QQP, SST-2): quotes are text, never field delimiters
    return csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)


def _column(path: Path, header: list[str], name: str | int | None) -> int | None:
    if name is None or isinstance(name, int):
        return name
    try:
        return header.index(name)
    except ValueError:
        raise DataError(
            f"{path}:1: no column {name!r} in the header ({' | '.join(header)[:200]}); this is not the GLUE TSV "
            "layout of docs/evaluation_data.md: use the official file"
        ) from None


def _label(t: Task, path: Path, line: int, value: str) -> int | float:
    value = value.strip()
    if t.kind == "regression":
        try:
            return float(value)
        except ValueError:
            raise DataError(f"{path}:{line}: label {value!r} is not a number; fix or drop the line") from None
    if value in t.label_names and not value.isdigit():
        return t.label_names.index(value)
    if value.isdigit() and int(value) < len(t.label_names):
        return int(value)
    raise DataError(
        f"{path}:{line}: label {value!r} is not one of {t.name}'s labels "
        f"({', '.join(t.label_names)} or 0..{len(t.label_names) - 1}); fix or drop the line"
    )


def _text_examples(t: Task, path: Path, split: str, limit: int | None, rows: Iterator[tuple[int, list[str]]],
                   cols: tuple[int, int | None, int], keep: Callable[[list[str]], bool] = lambda r: True,
                   expected: str = "") -> list[Example]:  # fmt: skip
    a, b, lab = cols
    need = max(c for c in cols if c is not None) + 1
    out: list[Example] = []
    for line, row in rows:
        if not row or row == [""]:
            continue
        if len(row) < need:
            raise DataError(
                f"{path}:{line}: {len(row)} tab-separated field(s), {t.name} needs at least {need}{expected}; the "
                "line is cut or the file is not the official one: re-extract it"
            )
        if not keep(row):
            continue
        out.append(
            TextExample(
                f"{t.name}-{split}-{len(out)}",
                row[a],
                row[b] if b is not None else None,
                _label(t, path, line, row[lab]),
            )  # fmt: skip
        )
        if limit is not None and len(out) >= limit:
            break
    return out


def _read_glue_tsv(t: Task, lay: TsvLayout, path: Path, split: str, limit: int | None) -> list[Example]:
    rows = _rows(path, _tsv)
    if lay.header:
        try:
            _, header = next(rows)
        except StopIteration:
            raise DataError(f"{path}: empty file; re-extract the task's data") from None
        header = [h.strip() for h in header]
        cols = tuple(_column(path, header, c) for c in (lay.text_a, lay.text_b, lay.label))
        expected = f" (header: {' | '.join(header)})"
    else:
        cols, expected = (lay.text_a, lay.text_b, lay.label), " (CoLA: source, label, original label, sentence)"
    out = _text_examples(t, path, split, limit, rows, cols, expected=expected)  # type: ignore[arg-type]
    return _nonempty(out, path)


def _load_xnli(t: Task, root: Path, split: str, limit: int | None) -> list[Example]:
    if split == "train":  # XNLI is trained on MNLI's English train set
        return [TextExample(f"xnli-train-{i}", e.text_a, e.text_b, e.label)
                for i, e in enumerate(load_split("mnli", root, "train", limit))]  # fmt: skip
    base, _, lang = split.partition("_")
    for d in _task_dirs(root, XNLI_DIRS + ("xnli",)):
        path = d / XNLI_FILES[base]
        if not path.is_file():
            continue
        rows = _rows(path, _tsv)
        try:
            _, header = next(rows)
        except StopIteration:
            raise DataError(f"{path}: empty file; re-extract XNLI") from None
        cols = tuple(_column(path, header, c) for c in ("sentence1", "sentence2", "gold_label"))
        li = _column(path, header, "language")
        keep = (lambda r: r[li] == lang) if lang else (lambda r: True)
        out = _text_examples(t, path, split, limit, rows, cols, keep)  # type: ignore[arg-type]
        return _nonempty(out, path, f"rows of language {lang!r}" if lang else "examples")
    # a Hugging Face export: one config per language (xnli/<lang>/<split>-*.parquet or save_to_disk)
    langs = (lang,) if lang else XNLI_LANGUAGES
    found = {code: _hf_table((f"xnli/{code}",), root, base) for code in langs}
    missing = [code for code, f in found.items() if f is None]
    if len(missing) == len(langs):
        raise _missing(t, root, split)
    if missing:
        raise DataError(
            f"task xnli, split {split}: the Hugging Face export under {root}/xnli has no {base} split for "
            f"{', '.join(missing)}; XNLI's {base} score pools all {len(XNLI_LANGUAGES)} languages: export every "
            f"language's config, or ask for one language ({base}_<lang>)"
        )
    out: list[Example] = []
    for code in langs:
        table, src = found[code]  # type: ignore[misc]
        out += _table_examples(t, table, src, split, None, first=len(out))
    return out[:limit] if limit is not None else out


def _read_swag_csv(path: Path, split: str, limit: int | None) -> list[Example]:
    rows = _rows(path, csv.reader)
    try:
        _, header = next(rows)
    except StopIteration:
        raise DataError(f"{path}: empty file; re-extract SWAG") from None
    names = ["sent1", "sent2", "ending0", "ending1", "ending2", "ending3", "label"]
    idx = {n: header.index(n) for n in names if n in header}
    if len(idx) < len(names):
        raise DataError(
            f"{path}:1: SWAG's CSV needs the columns {', '.join(names)} (header: {', '.join(header)[:200]}); use "
            "swagaf's data/train.csv or val.csv"
        )
    out: list[Example] = []
    need = max(idx.values()) + 1
    for line, row in rows:
        if len(row) < need:
            raise DataError(f"{path}:{line}: {len(row)} field(s), SWAG needs {need}; re-extract the file")
        label = row[idx["label"]].strip()
        if label not in ("", "0", "1", "2", "3"):
            raise DataError(f"{path}:{line}: label {label!r} is not 0..3; fix or drop the line")
        endings = tuple(row[idx[f"ending{k}"]] for k in range(4))
        out.append(ChoiceExample(f"swag-{split}-{len(out)}", row[idx["sent1"]], row[idx["sent2"]], endings,
                                 int(label) if label else None))  # fmt: skip
        if limit is not None and len(out) >= limit:
            break
    return _nonempty(out, path)


def _load_json(path: Path) -> Any:
    try:
        with _open_text(path) as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}:{e.lineno}: not valid JSON ({e.msg}, column {e.colno}); re-extract the file") from e
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text ({e.reason}); re-extract the file") from e


def _read_squad_json(t: Task, path: Path, limit: int | None) -> list[Example]:
    doc = _load_json(path)
    out: list[Example] = []
    where = "data"
    try:
        for i, article in enumerate(doc["data"]):
            for j, para in enumerate(article["paragraphs"]):
                context = para["context"]
                for k, qa in enumerate(para["qas"]):
                    where = f"data[{i}].paragraphs[{j}].qas[{k}]"
                    impossible = bool(qa.get("is_impossible", False))
                    answers = [] if impossible else qa["answers"]  # plausible_answers: never gold
                    if not impossible and not answers:
                        raise DataError(
                            f"{path}: {where} (id {qa.get('id')}) has no answers and is not is_impossible; "
                            f"{'a v1.1 question needs an answer' if not t.with_negative else 'mark it is_impossible'}"
                        )
                    out.append(QAExample(str(qa["id"]), qa["question"], context,
                                         tuple(a["text"] for a in answers), tuple(int(a["answer_start"])
                                                                                  for a in answers),
                                         impossible, t.name))  # fmt: skip
                    if limit is not None and len(out) >= limit:
                        return out
    except (KeyError, TypeError, ValueError) as e:
        if isinstance(e, DataError):
            raise
        raise DataError(
            f"{path}: {where}: missing or malformed field {e}; this is not SQuAD's official JSON (data -> paragraphs "
            "-> context, qas -> id, question, answers[text, answer_start]): use the official file"
        ) from None
    if any(ex.is_impossible for ex in out) and not t.with_negative:
        raise DataError(f"{path}: has unanswerable (is_impossible) questions; that is SQuAD 2.0: use task squad2")
    return _nonempty(out, path)


def _load_mrqa(t: Task, root: Path, split: str, limit: int | None) -> list[Example]:
    names = (MRQA_DATASETS[t.name], *MRQA_ALIASES.get(t.name, ()))
    for base in _subdirs(root, MRQA_DIRS):
        for d in _subdirs(base, MRQA_SPLIT_DIRS[split]):
            for fname in (f"{name}.jsonl{gz}" for name in names for gz in (".gz", "")):
                if (d / fname).is_file():
                    return _read_mrqa(t, d / fname, limit)
    found = _hf_table(MRQA_HF_DIRS, root, split)  # a Hugging Face export: every dataset, told apart by `subset`
    if found is None:
        raise _missing(t, root, split)
    return _mrqa_table(t, *found, names, limit)


def _mrqa_table(t: Task, table: Any, src: Path, names: tuple[str, ...], limit: int | None) -> list[Example]:
    import pyarrow as pa
    import pyarrow.compute as pc

    need = ("subset", "qid", "question", "context", "answers", "detected_answers")
    if not set(need) <= set(table.column_names):
        raise DataError(f"{src}: needs the columns {', '.join(need)} (has {', '.join(table.column_names)}); re-export")
    rows = table.filter(pc.is_in(table.column("subset"), value_set=pa.array(names)))
    if rows.num_rows == 0:
        have = sorted(set(table.column("subset").to_pylist()))
        raise DataError(f"{src}: no rows of {' or '.join(names)} (its subsets: {', '.join(have)}); export that one")
    out: list[Example] = []
    for r in rows.slice(0, limit).to_pylist() if limit is not None else rows.to_pylist():
        det = r["detected_answers"] or {}
        if isinstance(det, list):  # a list of answers rather than datasets' struct of lists
            det = {"text": [d["text"] for d in det], "char_spans": [d["char_spans"] for d in det]}
        spans: dict[str, list[list[int]]] = {}
        for text, cs in zip(det.get("text") or [], det.get("char_spans") or []):
            pairs = zip(cs["start"], cs["end"]) if isinstance(cs, dict) else ((c["start"], c["end"]) for c in cs)
            spans.setdefault(text, []).extend([int(a), int(b)] for a, b in pairs)
        out.append(_mrqa_example(str(r["qid"]), r["question"], r["context"], list(r["answers"]), spans, r["subset"]))
    return out


def _locate(context: str, text: str, spans: list[list[int]]) -> int:
    """Where ``text`` starts in ``context``: its detected char span (MRQA's inclusive [start, end]) when that span
    holds the text, else its first occurrence, else -1 (scored, but not a training target)."""
    for s, e in spans:
        if context[s : e + 1] == text or context[s : e + 1].lower() == text.lower():
            return int(s)
    return context.find(text)


def _mrqa_example(qid: str, question: str, context: str, answers: list[str], spans: dict[str, list[list[int]]],
                  dataset: str) -> QAExample:  # fmt: skip
    """One MRQA question: every alias in ``answers`` is gold, those found in the context first (at ``spans``)."""
    starts = [_locate(context, a, spans.get(a, [])) for a in answers]
    order = sorted(range(len(starts)), key=lambda i: starts[i] < 0)
    return QAExample(qid, question, context, tuple(answers[i] for i in order), tuple(starts[i] for i in order),
                     False, dataset)  # fmt: skip


def _read_mrqa(t: Task, path: Path, limit: int | None) -> list[Example]:
    out: list[Example] = []
    dataset = MRQA_DATASETS[t.name]
    with _open_text(path) as f:
        line = 0
        try:
            for line, raw in enumerate(f, 1):
                if not raw.strip():
                    continue
                obj = json.loads(raw)
                if line == 1 and "header" in obj:
                    dataset = obj["header"].get("dataset", dataset)
                    continue
                context = obj["context"]
                for qa in obj["qas"]:
                    spans: dict[str, list[list[int]]] = {}
                    for det in qa.get("detected_answers", []):
                        spans.setdefault(det["text"], []).extend(det.get("char_spans", []))
                    out.append(_mrqa_example(str(qa["qid"]), qa["question"], context, qa["answers"], spans, dataset))
                    if limit is not None and len(out) >= limit:
                        return out
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{line}: not a JSON line ({e.msg}); re-extract the file") from e
        except (KeyError, TypeError, ValueError) as e:
            raise DataError(
                f"{path}:{line}: missing or malformed field {e}; this is not MRQA's jsonl (a header line, then "
                "context / qas -> qid, question, answers, detected_answers): use the official file"
            ) from None
        except (OSError, EOFError) as e:
            raise DataError(f"{path}:{line}: cannot read ({e}); the file is cut: re-download it") from e
    return _nonempty(out, path)


# ------------------------------------------------------------------------------------- Hugging Face datasets exports
def _hf_table(dirs: Iterable[str], root: Path, split: str) -> tuple[Any, Path] | None:
    """The split's Arrow table from the first of ``dirs`` (under ``root``) that holds it, and where it was."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for d in _task_dirs(root, dirs):
        files = sorted(d.glob(f"{split}-*.parquet")) + sorted(d.glob(f"{split}.parquet"))
        files += sorted((d / split).glob("*.parquet")) if (d / split).is_dir() else []
        if files:
            try:
                return pa.concat_tables([pq.read_table(p) for p in files]), files[0]
            except (pa.ArrowException, OSError) as e:
                raise DataError(f"{files[0].parent}: cannot read its parquet files ({e}); re-export them") from e
        state = d / split / "state.json"  # save_to_disk: a DatasetDict's split, or a Dataset saved as <split>/
        if state.is_file():
            return _read_arrow_dir(d / split, state), d / split
    return None


def _read_arrow_dir(d: Path, state: Path) -> Any:
    """A ``datasets`` save_to_disk split: state.json's data files (Arrow IPC streams) in order."""
    import pyarrow as pa

    meta = _load_json(state)
    try:
        names = [f["filename"] for f in meta["_data_files"]]
    except (KeyError, TypeError):
        raise DataError(f"{state}: no _data_files list; this is not a datasets save_to_disk directory") from None
    tables = []
    for name in names:
        try:
            with pa.memory_map(str(d / name)) as src:
                tables.append(pa.ipc.open_stream(src).read_all())
        except (pa.ArrowException, OSError) as e:
            raise DataError(f"{d / name}: cannot read this Arrow file ({e}); save the dataset again") from e
    return pa.concat_tables(tables)


def _hf_label_names(table: Any) -> list[str] | None:
    meta = (table.schema.metadata or {}).get(b"huggingface")
    if not meta:
        return None
    try:
        feat = json.loads(meta)["info"]["features"]["label"]
        return list(feat["names"]) if feat.get("_type") == "ClassLabel" else None
    except (KeyError, TypeError, ValueError):
        return None


def _load_hf(t: Task, root: Path, split: str, limit: int | None) -> list[Example]:
    found = _hf_table(HF_DIRS.get(t.name, ()), root, split)
    if found is None:
        raise _missing(t, root, split)
    return _table_examples(t, *found, split, limit)


def _table_examples(t: Task, table: Any, src: Path, split: str, limit: int | None, first: int = 0) -> list[Example]:
    """A ``datasets`` table as examples (ids numbered from ``first``)."""
    if table.num_rows == 0:
        raise DataError(f"{src}: holds no rows; re-export it")
    if limit is not None:
        table = table.slice(0, limit)
    cols = set(table.column_names)
    get = lambda c: table.column(c).to_pylist()  # noqa: E731
    labels = get("label") if "label" in cols else [None] * table.num_rows
    names = _hf_label_names(table)
    if names is not None and t.label_names and tuple(names) != t.label_names:
        raise DataError(
            f"{src}: its label names {names} are not {t.name}'s {list(t.label_names)} (in that order); export the "
            "task's own dataset"
        )
    labels = [None if lab is None or lab < 0 else lab for lab in labels]  # -1 (-1.0 for STS-B): unlabelled
    if t.kind == "classification":
        bad = [lab for lab in labels if lab is not None and not 0 <= lab < len(t.label_names)]
        if bad:
            raise DataError(f"{src}: label {bad[0]} is not in 0..{len(t.label_names) - 1} ({t.name}); re-export it")
    if t.kind in ("classification", "regression"):
        pair = next(((a, b) for a, b in _HF_PAIRS if a in cols and b in cols), None)
        a, b = pair if pair else ("sentence", None)
        if a not in cols:
            raise DataError(f"{src}: no text columns ({', '.join(sorted(cols))}); export the task's own dataset")
        tb = get(b) if b else [None] * table.num_rows
        return [TextExample(f"{t.name}-{split}-{i}", x, y, lab) for i, (x, y, lab) in
                enumerate(zip(get(a), tb, labels), first)]  # fmt: skip
    need = {"multiple_choice": ("sent1", "sent2", "ending0", "ending1", "ending2", "ending3"),
            "extractive_qa": ("id", "question", "context", "answers")}[t.kind]  # fmt: skip
    if not set(need) <= cols:
        raise DataError(f"{src}: needs the columns {', '.join(need)} (has {', '.join(sorted(cols))}); re-export it")
    if t.kind == "multiple_choice":
        ends = list(zip(*(get(f"ending{k}") for k in range(4))))
        return [ChoiceExample(f"swag-{split}-{i}", c, p, tuple(e), lab) for i, (c, p, e, lab) in
                enumerate(zip(get("sent1"), get("sent2"), ends, labels))]  # fmt: skip
    out: list[Example] = []
    for qid, q, c, ans in zip(get("id"), get("question"), get("context"), get("answers")):
        texts, starts = tuple(ans["text"]), tuple(int(s) for s in ans["answer_start"])
        if not texts and not t.with_negative:
            raise DataError(f"{src}: question {qid} has no answer; that is SQuAD 2.0: use task squad2")
        out.append(QAExample(str(qid), q, c, texts, starts, not texts, t.name))
    return out


def layouts_text(task: str | Task, split: str | None = None) -> list[str]:
    """Where :func:`load_split` looks for ``task`` (relative to --data-dir; ``split``: for that split only), for
    the docs and the errors."""
    t = get_task(task)
    sp = split or "<split>"
    if t.name == "xnli":
        if split == "train":
            return ["MNLI's train split (any MNLI layout)"]
        base, _, lang = split.partition("_") if split else ("", "", "")
        out = [f"{XNLI_DIRS[0]}/{f}" for s, f in XNLI_FILES.items() if base in ("", s)]
        out.append(f"xnli/{lang or '<lang>'}/{base or '<split>'}-*.parquet or .../{base or '<split>'}/ (save_to_disk)")
        return out + ([] if split else ["train: MNLI's (any MNLI layout)"])
    if t.suite == "mrqa":
        dirs = MRQA_SPLIT_DIRS[split][0] if split else "{train,dev}"
        hf = f"mrqa/{sp}-*.parquet or mrqa/{sp}/ (save_to_disk; rows of subset {MRQA_DATASETS[t.name]})"
        return [f"[MRQA/]{dirs}/{MRQA_DATASETS[t.name]}.jsonl[.gz]", hf]
    out = []
    if t.name in TSV_LAYOUTS:
        lay = TSV_LAYOUTS[t.name]
        out.append(
            f"{lay.dirs[0]}/{lay.file(split)}" if split else f"{lay.dirs[0]}/{{{','.join(f for _, f in lay.files)}}}"
        )
    if t.name == "swag":
        out.append(f"SWAG/{SWAG_FILES[split][0]}" if split else "SWAG/{train,val}.csv")
    if t.name in SQUAD_FILES:
        out.append(
            f"[SQuAD/]{SQUAD_FILES[t.name][split]}"
            if split
            else "[SQuAD/]{" + ",".join(SQUAD_FILES[t.name].values()) + "}"
        )
    out += [f"{d}/{sp}-*.parquet or {d}/{sp}/ (save_to_disk)" for d in HF_DIRS.get(t.name, ())[:1]]
    return out


def docs_table() -> str:
    """docs/evaluation_data.md's table of tasks and the files each is read from (generated from the registries)."""
    from tools.evaluate.tasks import TASKS

    head = (
        "| task | suite | kind | labels (index order) | metrics (**table's**) | dev splits | files under --data-dir |"
    )
    lines = [head, "| --- | --- | --- | --- | --- | --- | --- |"]
    for t in TASKS.values():
        labels = ", ".join(t.label_names) or ("4 endings" if t.num_choices else "-")
        mets = ", ".join(f"**{m}**" if m == t.table_metric else m for m in t.metrics)
        files = "<br>".join(f"`{x}`" for x in layouts_text(t))
        lines.append(
            f"| `{t.name}` | {t.suite} | {t.kind} | {labels} | {mets} | {', '.join(t.eval_splits)} | {files} |"
        )
    return "\n".join(lines)


DOCS_BEGIN = "<!-- BEGIN GENERATED by `python -m tools.evaluate.data --write docs/evaluation_data.md` -->"
DOCS_END = "<!-- END GENERATED -->"


def splice_docs(doc: str) -> str:
    """``doc`` with the text between its generated-table markers replaced by :func:`docs_table`."""
    head, sep, rest = doc.partition(DOCS_BEGIN)
    _, sep2, tail = rest.partition(DOCS_END)
    if not sep or not sep2:
        raise ValueError(f"the document has no {DOCS_BEGIN} ... {DOCS_END} block")
    return f"{head}{DOCS_BEGIN}\n\n{docs_table()}\n\n{DOCS_END}{tail}"


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["--write"] and len(sys.argv) == 3:
        target = Path(sys.argv[2])
        target.write_text(splice_docs(target.read_text(encoding="utf-8")), encoding="utf-8")
    else:
        print(docs_table())
