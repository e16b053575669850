"""The host syncs a step would make on a GPU, counted on CPU: what ``torch.cuda.set_sync_debug_mode`` reports there.

What CUDA's sync debug mode flags (c10/cuda/CUDAFunctions.h: ``warn_or_error_on_sync`` is called by
``memcpy_and_sync`` and ``stream_synchronize``, and by ``torch.cuda.synchronize``), and what we count here:

- a blocking copy between host and device, either way: reading a value (``_local_scalar_dense``: ``.item()``,
  ``bool()``, ``int()``, ``float()``; ``.cpu()``, ``.tolist()``, ``.numpy()``), and a copy of host memory to the device
  without ``non_blocking`` (``torch.tensor(x, device=d)``, ``torch.as_tensor(x, device=d)``, ``.to(d)`` and
  ``.copy_()`` of a host tensor). ``.to(d, non_blocking=True)`` is not flagged (pinned memory: truly asynchronous);
- ops whose output shape depends on the values, which read a count back: ``nonzero``, ``masked_select``,
  indexing or ``index_put_`` with a boolean mask, ``unique``, ``repeat_interleave`` without ``output_size``;
- ``masked_fill_`` with a 0-dim tensor value that lives on the device (ATen's CUDA kernel calls ``value.item()``;
  a host 0-dim value is read on the host, no sync). ``fill_`` and ``index_put_`` with a device 0-dim value copy it
  on the device (ATen's ``fill_`` reads only a value of another device): not counted;
- ``equal`` (returns a Python bool), and DeepSpeed's accelerator ``synchronize()`` (on CPU it returns at once).

Which tensors live on the device. On CPU every tensor is a CPU tensor, so the counter tracks where each one *would*
live (provenance). Everything is on the device except what is known to be on the host: a tensor made in the counted
code without a ``device`` argument (``torch.tensor(1.0)``, ``torch.zeros(3)``: a Python-side constant), what
``.cpu()``/``.pin_memory()`` return, what the host sections make (:meth:`HostSyncCounter.host`: the DataLoader's
collation, token counting), and whatever is computed from host tensors only. A factory *with* a ``device`` argument
makes a device tensor; tensors that existed before counting (parameters, gradients, optimizer state, DeepSpeed's
buffers) are on the device. Why this choice: it needs no change to the code under test (no fake device type, which
DeepSpeed and the model would refuse or special-case), and it reproduces the H200's count for the code paths that run
on CPU too (docs/performance.md). Its one blind spot: code that names the host explicitly (``device="cpu"``)
inside the step is taken for the device, since the trainer's device is ``cpu`` here; and ``.to("cpu")`` of a device
tensor is taken for a copy on the device. Neither occurs in the step (the GPU counts agree).

Sites are ``path:function`` of our code, ``(deepspeed) ...`` for DeepSpeed's own (with its caller when that is
DeepSpeed's too), ``(torch.optim) ...`` for torch's optimizers; the kind of sync follows in parentheses.
"""

from __future__ import annotations

import os
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakTensorKeyDictionary

REPO = Path(__file__).resolve().parents[2]
DEBUG = bool(os.environ.get("SYNC_DEBUG"))
"""SYNC_DEBUG=1 adds the line number to each site."""
T = TypeVar("T")

#: aten ops that make the host wait for a device input: value reads and data-dependent output shapes
READS = frozenset({"_local_scalar_dense", "equal", "nonzero", "masked_select"})
UNIQUE = frozenset({"_unique", "_unique2", "unique_dim", "unique_consecutive", "unique_dim_consecutive"})
#: torch functions that make a tensor from Python data or a size: host without a ``device`` argument
FACTORIES = frozenset(
    {
        "tensor",
        "as_tensor",
        "scalar_tensor",
        "zeros",
        "ones",
        "empty",
        "full",
        "arange",
        "linspace",
        "rand",
        "randn",
        "randint",
        "eye",
    }
)
#: of those, the ones that copy Python data (host memory) into the new tensor
FROM_DATA = frozenset({"tensor", "as_tensor"})


def _site(skip: tuple[Path, ...]) -> str:
    """Who made the call: the innermost frame outside torch and the ``skip`` files."""
    stack = list(reversed(traceback.extract_stack()))
    for i, frame in enumerate(stack):
        path = Path(frame.filename).resolve()
        where = f":{frame.name}" + (f"@{frame.lineno}" if DEBUG else "")
        if path.parts[-3:-1] == ("torch", "optim"):
            return f"(torch.optim) {path.name}{where}"
        if path in skip or "torch" in path.parts:
            continue
        if "deepspeed" in path.parts:
            inside = Path(*path.parts[path.parts.index("deepspeed") :])
            caller = stack[i + 1] if i + 1 < len(stack) else None
            if caller is not None and "deepspeed" in Path(caller.filename).parts:
                where += f" <- {Path(caller.filename).name}:{caller.name}"
            return f"(deepspeed) {inside}{where}"
        if path.is_relative_to(REPO):
            return f"{path.relative_to(REPO)}{where}"
        return f"(other) {path}{where}"
    return "(unknown)"


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


class HostSyncCounter:
    """``with counter:`` counts, in ``counter.sites``, the host syncs the code inside would make on a GPU (module
    docstring); ``skip`` are further files whose frames are not sites (the caller's own)."""

    def __init__(self, skip: tuple[Path, ...] = ()) -> None:
        self.sites: Counter[str] = Counter()
        self._skip = (Path(__file__).resolve(), *(p.resolve() for p in skip))
        self._host: WeakTensorKeyDictionary = WeakTensorKeyDictionary()
        self._paused = 0
        self._modes: list[Any] = []
        self._undo: Callable[[], None] | None = None

    # ------------------------------------------------------------------ where tensors live
    def is_host(self, t: torch.Tensor) -> bool:
        return t in self._host

    def _mark(self, out: Any, host: bool) -> None:
        for t in _tensors(out):
            if host:
                self._host[t] = True
            else:
                self._host.pop(t, None)

    def _count(self, kind: str) -> None:
        if not self._paused:
            self.sites[f"{_site(self._skip)} ({kind})"] += 1

    # ------------------------------------------------------------------ host sections
    def host(self, fn: Callable[..., T]) -> Callable[..., T]:
        """``fn`` runs on the host (the DataLoader's collation, token counting): nothing inside is counted, and what
        it returns lives on the host."""
        return self._uncounted(fn, host=True)

    def to_device(self, fn: Callable[..., T]) -> Callable[..., T]:
        """``fn`` stages host tensors to the device asynchronously (pinned memory, ``non_blocking``; the trainer's
        ``_to_device`` on CUDA): not counted, and what it returns lives on the device."""
        return self._uncounted(fn, host=False)

    def _uncounted(self, fn: Callable[..., T], host: bool) -> Callable[..., T]:
        def run(*a: Any, **k: Any) -> T:
            self._paused += 1
            try:
                out = fn(*a, **k)
            finally:
                self._paused -= 1
            self._mark(out, host=host)
            return out

        return run

    # ------------------------------------------------------------------ the modes
    def _on_function(self, func: Callable, args: tuple, kwargs: dict) -> Any:
        name = getattr(func, "__name__", "")
        if name in FACTORIES and func is getattr(torch, name, None):
            out = func(*args, **kwargs)
            device = kwargs.get("device")
            from_data = name in FROM_DATA and args and not isinstance(args[0], torch.Tensor)
            if device is not None and from_data:
                self._count("host-to-device copy")
            if not (name == "as_tensor" and args and isinstance(args[0], torch.Tensor) and device is None):
                self._mark(out, host=device is None)
            return out
        if func is torch.Tensor.to:
            src = args[0]
            device, _, non_blocking, _ = torch._C._nn._parse_to(*args[1:], **kwargs)
            if device is None and len(args) > 1 and isinstance(args[1], torch.Tensor):
                device = args[1].device  # .to(other): that tensor's device
            if device is None or not self.is_host(src):
                return func(*args, **kwargs)
            if not non_blocking:
                self._count("host-to-device copy")
            out = func(*args, **kwargs)
            if out is src:  # on CPU .to(device) is a no-op; on a GPU it is a new tensor on the device
                out = src.clone()
            self._mark(out, host=False)
            return out
        if func is torch.Tensor.copy_:
            dst, src = args[0], args[1]
            non_blocking = kwargs.get("non_blocking", args[2] if len(args) > 2 else False)
            if isinstance(src, torch.Tensor) and self.is_host(dst) != self.is_host(src) and not non_blocking:
                self._count("host-to-device copy" if self.is_host(src) else "device-to-host copy")
            return func(*args, **kwargs)
        if func in (torch.Tensor.cpu, torch.Tensor.tolist, torch.Tensor.numpy):
            src = args[0]
            if not self.is_host(src):
                self._count(f"device-to-host copy: {name}")
            out = func(*args, **kwargs)
            if func is torch.Tensor.cpu:
                out = out.clone() if out is src and not self.is_host(src) else out
                self._mark(out, host=True)
            return out
        if func is torch.Tensor.pin_memory:
            out = func(*args, **kwargs)
            self._mark(out, host=True)
            return out
        return func(*args, **kwargs)

    def _on_aten(self, func: Any, args: tuple, kwargs: dict) -> Any:
        name = func.overloadpacket.__name__
        inputs = _tensors((args, kwargs))
        on_device = [t for t in inputs if not self.is_host(t)]
        if on_device:
            kind = None
            if name in READS or name in UNIQUE:
                kind = name
            elif name == "repeat_interleave" and func.name().endswith(".Tensor") and kwargs.get("output_size") is None:
                if len(args) < 3 or args[2] is None:  # (repeats, dim, output_size) when called as a function
                    kind = "repeat_interleave without output_size"
            elif name in ("index", "index_put", "index_put_", "_index_put_impl_") and any(
                isinstance(t, torch.Tensor) and t.dtype in (torch.bool, torch.uint8)
                for t in (args[1] if len(args) > 1 and args[1] is not None else [])
                if t is not None
            ):
                kind = f"{name} with a boolean mask"
            elif name in ("masked_fill", "masked_fill_") and isinstance(args[2], torch.Tensor):
                if not self.is_host(args[2]):
                    kind = f"{name} with a device value"
            if kind is not None:
                self._count(kind)
        out = func(*args, **kwargs)
        if self._paused or (inputs and not on_device):
            self._mark(out, host=True)
        return out

    def count_synchronize(self) -> Callable[[], None]:
        """Count DeepSpeed's accelerator ``synchronize()`` (every caller asks the one accelerator object); returns
        the undo."""
        from deepspeed.accelerator import get_accelerator

        accelerator = get_accelerator()
        real = accelerator.synchronize

        def synchronize(*a: Any, **k: Any) -> Any:
            self._count("synchronize")
            return real(*a, **k)

        accelerator.synchronize = synchronize

        def undo() -> None:
            accelerator.synchronize = real

        return undo

    def __enter__(self) -> HostSyncCounter:
        me = self

        class Functions(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                return me._on_function(func, args, kwargs or {})

        class Aten(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                return me._on_aten(func, args, kwargs or {})

        self._modes = [Functions(), Aten()]
        for m in self._modes:
            m.__enter__()
        self._undo = self.count_synchronize()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._undo is not None:
            self._undo()
        for m in reversed(self._modes):
            m.__exit__(*exc)
        self._modes = []
