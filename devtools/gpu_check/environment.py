"""The machine line of the report: GPU, driver, CUDA, torch, DeepSpeed, date, commit. It fails the check when a
GPU's architecture has no kernels in this torch build, and when ``nvidia-smi`` sees GPUs that torch cannot use (a
driver too old for the build's CUDA, a CPU-only torch) instead of reporting "no GPU"."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import subprocess
import time

from common.provenance import commit_info
from devtools.gpu_check.runner import REPO


def arch_runs_on(capability: tuple[int, int], arch_list: list[str]) -> bool:
    """Whether a torch build with ``arch_list`` has kernels for a GPU of compute ``capability``.

    SASS ``sm_XY`` runs on the same major version with an equal or higher minor one only (``sm_75`` does not run on
    a 7.0 V100); PTX ``compute_XY`` is JIT-compiled for any GPU of capability XY or higher."""
    major, minor = capability
    for arch in arch_list:
        kind, _, digits = arch.partition("_")
        digits = digits.rstrip("af")  # sm_90a, sm_100f: architecture-specific variants of 9.0, 10.0
        if not digits.isdigit() or len(digits) < 2:
            continue
        a_major, a_minor = int(digits[:-1]), int(digits[-1])
        if kind == "sm" and a_major == major and a_minor <= minor:
            return True
        if kind == "compute" and (a_major, a_minor) <= (major, minor):
            return True
    return False


def torch_variant_module():
    """run_scripts/torch_variant.py (the one home of the driver table), loaded from its file."""
    spec = importlib.util.spec_from_file_location("torch_variant", REPO / "run_scripts" / "torch_variant.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def nvidia_smi_gpus() -> list[dict] | None:
    """The GPUs nvidia-smi lists (name, driver, memory, compute capability), or None without a working nvidia-smi."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    gpus = []
    for line in out.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 4:
            gpus.append({"index": parts[0], "name": parts[1], "driver": parts[2], "memory": parts[3]})
    caps = torch_variant_module().compute_capabilities()
    for g, cap in zip(gpus, caps or []):
        g["capability"] = f"{cap[0]}.{cap[1]}"
    return gpus


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment_report() -> tuple[str, dict, list[str]]:
    """(markdown, data, problems): torch, CUDA, the driver, the GPUs (as torch and nvidia-smi see them), package
    versions, date and commit. A problem fails the check: a GPU torch has no kernels for, or GPUs nvidia-smi sees
    that torch cannot use."""
    import warnings

    import torch

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        available = torch.cuda.is_available()
    commit, commit_from = commit_info()
    smi = nvidia_smi_gpus()
    data = {
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "commit": commit,
        "commit_source": commit_from,
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if available else None,
        "driver": (smi[0]["driver"] if smi else None),
        "deepspeed": _version("deepspeed"),
        "transformers": _version("transformers"),
        "triton": _version("triton"),
        "arch_list": torch.cuda.get_arch_list() if available else [],
        "cuda_available": available,
        "nvidia_smi_gpus": smi,
        "gpus": [],
    }
    problems = []
    if available:
        for i in range(torch.cuda.device_count()):
            major, minor = torch.cuda.get_device_capability(i)
            name = torch.cuda.get_device_name(i)
            data["gpus"].append({"index": i, "name": name, "capability": f"{major}.{minor}"})
            if not arch_runs_on((major, minor), data["arch_list"]):
                problems.append(
                    f"GPU {i} {name} (sm_{major}{minor}) has no kernels in this torch build "
                    f"({' '.join(data['arch_list'])}): re-run run_scripts/setup_env.sh "
                    "(docs/troubleshooting.md)"
                )
    elif smi:
        problems.append(
            unusable_gpus_problem(smi, torch.__version__, torch.version.cuda, [str(w.message) for w in caught])
        )
    gpus = "; ".join(f"{g['index']}: {g['name']} (sm {g['capability']})" for g in data["gpus"]) or (
        "none usable" if smi else "none"
    )
    md = (
        f"GPUs: {gpus}; driver {data['driver']}; torch {data['torch']} (CUDA {data['cuda']}, cuDNN {data['cudnn']}); "
        f"DeepSpeed {data['deepspeed']}; transformers {data['transformers']}; triton {data['triton']}; "
        f"python {data['python']}; {data['cpus']} CPUs; host {data['host']}; commit {commit} ({commit_from}); "
        f"{data['date_utc']} UTC"
    )
    return md, data, problems


def unusable_gpus_problem(smi: list[dict], torch_version: str, torch_cuda: str | None, warnings_seen: list[str]) -> str:
    """Why torch cannot use GPUs that nvidia-smi lists, and what to do (never 'no GPU')."""
    tv = torch_variant_module()
    driver = smi[0].get("driver") or "unknown"
    names = ", ".join(sorted({g["name"] for g in smi}))
    head = f"nvidia-smi sees {len(smi)} GPU(s) ({names}, driver {driver}) but torch {torch_version} cannot use them: "
    if torch_cuda is None:
        why = "this torch is a CPU-only build; install a CUDA build (run_scripts/setup_env.sh; TORCH=system reuses one)"
    else:
        major = int(torch_cuda.split(".")[0])
        need = tv.CUDA_DRIVER_MIN.get(major)
        if need and not tv.driver_runs_cuda(driver, major):
            why = (
                f"it is built for CUDA {torch_cuda}, which needs a driver >= {'.'.join(map(str, need))} (NVIDIA's CUDA "
                f"compatibility table); update the driver or install the build "
                f"`python3 run_scripts/torch_variant.py --explain` names (TORCH_VARIANT=cu126 for CUDA 12.6)"
            )
        else:
            why = "torch.cuda.is_available() is False (CUDA_VISIBLE_DEVICES={!r})".format(
                os.environ.get("CUDA_VISIBLE_DEVICES")
            )
    seen = [w for w in warnings_seen if w.strip()]
    return head + why + (f"; torch said: {seen[0][:300]}" if seen else "")
