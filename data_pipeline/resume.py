"""Progress bookkeeping that makes a killed run resumable.

``{prefix}.progress.json`` (the manifest) records the settings hash and the input list; every input
file becomes one *part* shard in ``{prefix}.parts/``, committed by atomic rename, and then marked
done by its own small ``part-NNNNN.done.json`` (input size and mtime, counts, bad-input log).
Per-part markers rather than one shared file let MPI ranks finish parts without racing on a file.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass

from common.errors import UserError
from data_pipeline import multistream

MANIFEST_VERSION = 1


class ResumeError(UserError, RuntimeError):
    """A progress file is in the way or does not match this run; the message says what to do."""


def file_digest(path: str | None) -> str | None:
    """sha256 of a file, or of every file in a directory (a tokenizer directory)."""
    if not path:
        return None
    h = hashlib.sha256()
    paths = [path] if os.path.isfile(path) else sorted(os.path.join(r, f) for r, _, fs in os.walk(path) for f in fs)
    for p in paths:
        h.update(os.path.relpath(p, path).encode() if p != path else b"")
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def settings_hash(settings: dict) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def input_stamp(path: str) -> dict:
    """What identifies an input as it is now: its name (a file, or a unit of a multistream dump) and its file's size
    and modification time."""
    try:
        st = os.stat(multistream.unit_file(path))
        return {"path": path, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    except OSError:
        return {"path": path, "size": None, "mtime_ns": None}


def write_json_atomic(path: str, obj: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


@dataclass
class RunLayout:
    """Where one run's files live."""

    output_prefix: str

    @property
    def manifest(self) -> str:
        return self.output_prefix + ".progress.json"

    @property
    def parts_dir(self) -> str:
        return self.output_prefix + ".parts"

    @property
    def report(self) -> str:
        """``{dir}/reports/{name}.report.json``: in a sub-directory, because Megatron's tools/merge_datasets.py
        --input DIR takes every *file* of DIR for half of a .bin/.idx pair (and fails on anything else)."""
        head, name = os.path.split(self.output_prefix)
        return os.path.join(head, "reports", name + ".report.json")

    def part_prefix(self, idx: int, key: str, level: str) -> str:
        return os.path.join(self.parts_dir, f"part-{idx:05d}_{key}_{level}")

    def part_marker(self, idx: int) -> str:
        return os.path.join(self.parts_dir, f"part-{idx:05d}.done.json")

    def final_prefix(self, key: str, level: str) -> str:
        return f"{self.output_prefix}_{key}_{level}"


def find_report(shard_prefix: str) -> tuple[str, dict] | None:
    """(path, content) of the preprocessing report that lists ``shard_prefix`` among its outputs (``{dir}/reports/
    {name}.report.json`` with ``{dir}/{name}_{key}_{level}`` = the shard), or None (a shard from Megatron, or
    merged, or renamed)."""
    head, shard = os.path.split(shard_prefix)
    reports = os.path.join(head, "reports")
    if not os.path.isdir(reports):
        return None
    for fname in sorted(os.listdir(reports)):
        name = fname.removesuffix(".report.json")
        if fname == name or not shard.startswith(name + "_"):
            continue
        path = os.path.join(reports, fname)
        try:
            with open(path) as f:
                report = json.load(f)
        except (OSError, json.JSONDecodeError):
            continue
        if any(os.path.basename(str(o)) == shard for o in (report.get("outputs") or {}).values()):
            return path, report
    return None


def prepare(layout: RunLayout, shash: str, inputs: list[str], resume: bool) -> bool:
    """Check or create the manifest. Returns True when resuming an interrupted run."""
    if os.path.exists(layout.manifest):
        if not resume:
            raise ResumeError(
                f"{layout.manifest} exists: a previous run with this --output-prefix was interrupted. "
                f"Pass --resume to continue it, or delete {layout.manifest} and {layout.parts_dir}/ "
                f"to start over."
            )
        with open(layout.manifest) as f:
            try:
                man = json.load(f)
            except json.JSONDecodeError as e:
                raise ResumeError(
                    f"{layout.manifest}: unreadable ({e}); delete it and {layout.parts_dir}/ to start over"
                ) from None
        if man.get("settings_hash") != shash:
            raise ResumeError(
                f"{layout.manifest}: the interrupted run used different settings (tokenizer, vocab, "
                f"keys, sentence splitting, ...); rerun with the same flags, or delete it and "
                f"{layout.parts_dir}/ to start over"
            )
        if man.get("inputs") != inputs:
            raise ResumeError(
                f"{layout.manifest}: the interrupted run had a different input list "
                f"({len(man.get('inputs', []))} files, now {len(inputs)}); rerun with the same --input, "
                f"or delete it and {layout.parts_dir}/ to start over"
            )
        os.makedirs(layout.parts_dir, exist_ok=True)
        return True
    if os.path.isdir(layout.parts_dir):  # left-overs without a manifest are never trusted
        shutil.rmtree(layout.parts_dir)
    os.makedirs(layout.parts_dir, exist_ok=True)
    os.makedirs(os.path.dirname(os.path.abspath(layout.manifest)), exist_ok=True)
    write_json_atomic(layout.manifest, {"version": MANIFEST_VERSION, "settings_hash": shash, "inputs": inputs})
    return False


def completed_marker(layout: RunLayout, idx: int, path: str, shash: str, keys: list[str], level: str) -> dict | None:
    """The done-marker of part ``idx`` if it is valid for this input as it is now, else None."""
    mpath = layout.part_marker(idx)
    if not os.path.exists(mpath):
        return None
    try:
        with open(mpath) as f:
            marker = json.load(f)
    except (OSError, json.JSONDecodeError):
        return None
    stamp = input_stamp(path)
    if marker.get("settings_hash") != shash or marker.get("input") != stamp:
        return None
    for key in keys:
        p = layout.part_prefix(idx, key, level)
        if not (os.path.exists(p + ".bin") and os.path.exists(p + ".idx")):
            return None
    return marker


def finish(layout: RunLayout) -> None:
    """Remove the bookkeeping after the final shards are in place (manifest first: see module doc)."""
    if os.path.exists(layout.manifest):
        os.remove(layout.manifest)
    shutil.rmtree(layout.parts_dir, ignore_errors=True)


__all__ = [
    "RunLayout",
    "ResumeError",
    "prepare",
    "completed_marker",
    "finish",
    "find_report",
    "file_digest",
    "settings_hash",
    "input_stamp",
    "write_json_atomic",
]
