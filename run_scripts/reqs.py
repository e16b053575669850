#!/usr/bin/env python3
"""What to pip-install, read from requirements.txt, the one place our versions live (standard library only: it runs
before anything is installed, under the python that setup_env.sh or make_wheelhouse.sh was given).

Each line of requirements.txt pins the version CI tests (`name==X`) or gives a range (`name>=A,<B`). A trailing
`# floor: V` comment lowers what an existing install may have: `transformers==5.23.0  # floor: 5.17.0` means a
fresh venv gets 5.23.0 and an image's 5.17.0 is kept. Without it the floor is the `>=` bound, else the pin.
A `# dev` comment marks what only the tests and the linter need (`make_wheelhouse.sh --no-dev` leaves it out).
A `# cpu-torch` comment marks a package of torch's own family that a CUDA torch brings (triton): `plan`, `pins` and
`floors` leave it out, so a CUDA torch's own build is never replaced; `cpu-torch` prints it only where this python's
torch is a CPU build that brought none (tests/test_triton_block.py runs our Triton kernel in Triton's interpreter).

    reqs.py plan --out-dir D                   # TORCH=system: compare with what this python has; write
                                               #   D/install.txt (pins of what is missing or too old) and
                                               #   D/constraints.txt (the kept versions, torch's included)
    reqs.py plan --present FREEZE --out-dir D  # the same against a `pip list --format=freeze` (make_wheelhouse.sh)
    reqs.py floors                             # every requirement at its floor (the .venv-floor test venv)
    reqs.py pins [--no-dev]                    # every requirement as a fresh venv gets it
    reqs.py range torch                        # `>=2.11.0` (plus the tested pin), for messages
    reqs.py cpu-torch [--floor] [--wheelhouse D]  # the `# cpu-torch` pins this python's CPU torch lacks (else none)
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

REQUIREMENTS = Path(__file__).resolve().parents[1] / "requirements.txt"
# torch's own CUDA/compiler packages: never downloaded or installed by us (the image's torch brings them)
TORCH_FAMILY = re.compile(r"^(torch|triton|nvidia-.*|cuda-.*|pytorch-triton.*)$")


def normalize(name: str) -> str:
    """PEP 503 name: `Typing_Extensions` and `typing-extensions` are one package."""
    return re.sub(r"[-_.]+", "-", name).lower()


def version_key(version: str) -> tuple:
    """Sort key of a PEP 440 version, enough for release numbers with rc/dev/post suffixes (`2.11.0+cu130` ==
    `2.11.0`: the local label is ignored)."""
    v = version.strip().lower().split("+", 1)[0]
    m = re.match(
        r"v?(\d+(?:\.\d+)*)(?:[.-]?(a|alpha|b|beta|rc|c)\.?(\d*))?(?:[.-]?post\.?(\d*))?(?:[.-]?dev\.?(\d*))?", v
    )
    if not m:
        raise ValueError(f"cannot read version {version!r}")
    release = [int(x) for x in m.group(1).split(".")]
    while len(release) > 1 and release[-1] == 0:
        release.pop()
    pre_rank = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "rc": 2, "c": 2}
    pre = (pre_rank[m.group(2)], int(m.group(3) or 0)) if m.group(2) else (3, 0)  # a release sorts after its rcs
    post = int(m.group(4) or 0) if m.group(4) is not None else -1
    dev = (0, int(m.group(5) or 0)) if m.group(5) is not None else (1, 0)  # X.devN sorts before X
    if m.group(5) is not None and not m.group(2) and m.group(4) is None:
        pre = (-1, 0)  # 1.0.dev1 < 1.0a1
    return (tuple(release), pre, post, dev)


@dataclass(frozen=True)
class Requirement:
    """One line of requirements.txt."""

    name: str  # as written (pip accepts it)
    pin: str | None  # `==` version: what a fresh venv installs
    floor: str | None  # lowest version an existing install may have (None: any)
    cap: str | None  # `<` bound (None: none)
    spec: str  # the specifier as written, e.g. `>=1.26,<3`
    dev: bool = False  # `# dev`: tests/lint only; an offline set-up without its wheel skips it (says so)
    cpu_torch: bool = False  # `# cpu-torch`: only beside a CPU torch that has none (a CUDA torch brings its own)

    @property
    def key(self) -> str:
        return normalize(self.name)

    def accepts(self, version: str) -> bool:
        """Whether an installed `version` is in our supported range (kept, not reinstalled)."""
        k = version_key(version)
        if self.floor is not None and k < version_key(self.floor):
            return False
        return self.cap is None or k < version_key(self.cap)

    def range_text(self) -> str:
        parts = [f">={self.floor}"] if self.floor else []
        if self.cap:
            parts.append(f"<{self.cap}")
        text = ",".join(parts) or "any version"
        return f"{text} (tested: {self.pin})" if self.pin and self.pin != self.floor else text

    def install_line(self) -> str:
        """What a fresh install gets: the pin, else the range as written."""
        return f"{self.name}=={self.pin}" if self.pin else f"{self.name}{self.spec}"


def parse(path: Path = REQUIREMENTS) -> list[Requirement]:
    """Requirements of `path`, with their floors; a line we cannot read is an error naming it."""
    reqs = []
    for lineno, raw in enumerate(path.read_text().splitlines(), 1):
        line, _, comment = raw.partition("#")
        line = line.strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*((?:(?:==|>=|<=|!=|~=|<|>)\s*[^,\s<>=!~]+\s*,?\s*)*)", line)
        if not m:
            raise ValueError(f"{path}:{lineno}: cannot read requirement {line!r} (write `name==X` or `name>=A,<B`)")
        name, spec = m.group(1), m.group(2).replace(" ", "")
        pin = floor = cap = None
        for op, ver in re.findall(r"(==|>=|<=|<|>|!=|~=)([^,]+)", spec):
            if op == "==":
                pin = ver
            elif op in (">=", "~="):
                floor = ver
            elif op == "<":
                cap = ver
            else:
                raise ValueError(f"{path}:{lineno}: {name}: operator {op!r} is not supported here (use ==, >=, <)")
        fm = re.search(r"floor:\s*([^\s,;]+)", comment)
        if fm:
            if pin is None:
                raise ValueError(f"{path}:{lineno}: {name}: a `# floor:` needs a `==` pin to lower from")
            if version_key(fm.group(1)) > version_key(pin):
                raise ValueError(f"{path}:{lineno}: {name}: floor {fm.group(1)} is above the pin {pin}")
            floor = fm.group(1)
        elif floor is None:
            floor = pin
        dev = bool(re.search(r"(^|[\s,])dev([\s,:]|$)", comment))
        cpu_torch = bool(re.search(r"(^|[\s,])cpu-torch([\s,:]|$)", comment))
        if cpu_torch and not TORCH_FAMILY.match(normalize(name)):
            raise ValueError(f"{path}:{lineno}: {name}: `# cpu-torch` is for torch's own family (triton), not {name}")
        reqs.append(Requirement(name, pin, floor, cap, spec, dev=dev, cpu_torch=cpu_torch))
    return reqs


def installed_versions() -> dict[str, str]:
    """Every distribution this interpreter sees (its venv, --system-site-packages, .pth'd dirs): first one wins,
    as for imports."""
    import importlib.metadata as md

    found: dict[str, str] = {}
    for dist in md.distributions():
        name = dist.metadata["Name"]
        if name:
            found.setdefault(normalize(name), dist.version)
    return found


def read_freeze(path: Path) -> dict[str, str | None]:
    """A `pip list --format=freeze` (or `name==version` / bare `name` lines: present at a version not known)."""
    present: dict[str, str | None] = {}
    for lineno, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:(?:==|===)\s*(\S+))?", line)
        if not m:
            raise ValueError(f"{path}:{lineno}: expected `name==version` or `name`, got {line!r}")
        present[normalize(m.group(1))] = m.group(2)
    return present


@dataclass
class Plan:
    """What TORCH=system keeps and what it installs."""

    kept: list[tuple[Requirement, str | None]]  # (requirement, present version; None = present, version unknown)
    install: list[tuple[Requirement, str | None]]  # (requirement, present version too old or None if missing)
    constraints: list[str]  # `name==version` for torch and every kept package (pip must not move them)


def plan(reqs: list[Requirement], present: dict[str, str | None]) -> Plan:
    """Keep what is there and in range, install the pin of the rest. torch must be there and in range: we never
    install it in this mode (ValueError otherwise, saying what to do)."""
    kept, install, constraints = [], [], []
    for r in reqs:
        if r.cpu_torch:  # torch's own family: never beside the image's torch (`cpu-torch` adds it to a CPU torch)
            continue
        if r.key not in present:
            if r.key == "torch":
                raise ValueError(
                    "TORCH=system: this python has no torch. Load the image's/module's PyTorch first, or use "
                    "TORCH=pinned (a fresh venv with torch from requirements.txt)"
                )
            install.append((r, None))
            continue
        ver = present[r.key]
        if ver is None or r.accepts(ver):
            kept.append((r, ver))
            if ver is not None:
                constraints.append(f"{r.name}=={ver}")
        elif r.key == "torch":
            raise ValueError(
                f"TORCH=system: this python's torch {ver} is outside the supported range {r.range_text()}. Use "
                "another image/module with a torch in range, or TORCH=pinned (needs the network or a wheelhouse "
                "with torch); see docs/troubleshooting.md, 'Air-gapped clusters and preinstalled PyTorch'"
            )
        else:
            install.append((r, ver))
    return Plan(kept, install, constraints)


def torch_is_cpu_build() -> bool:
    """Whether this python's torch is built without CUDA and ROCm (False where torch is missing)."""
    try:
        import torch
    except ImportError:
        return False
    return not (torch.version.cuda or torch.version.hip)


def cpu_torch_extras(reqs: list[Requirement], present: dict[str, str | None], cpu_build: bool) -> list[Requirement]:
    """The `# cpu-torch` requirements to install: none beside a CUDA/ROCm torch (it brought its own), else those
    missing (a present one, any version, is torch's and kept)."""
    if not cpu_build:
        return []
    return [r for r in reqs if r.cpu_torch and r.key not in present]


def wheel_in(wheelhouse: Path, r: Requirement) -> bool:
    """Whether `wheelhouse` has a wheel of `r` (any version: pip decides whether it fits)."""
    stem = re.sub(r"[-_.]+", "_", r.name).lower()
    return any(w.name.lower().startswith(stem + "-") for w in wheelhouse.glob("*.whl"))


def drop_dev_not_in(p: Plan, wheelhouse: Path) -> Plan:
    """Offline: a `# dev` requirement the wheelhouse lacks (`make_wheelhouse.sh --no-dev`) is skipped, said."""
    keep = []
    for r, ver in p.install:
        if r.dev and not wheel_in(wheelhouse, r):
            print(f"[setup] skipped   {r.install_line()}: tests/lint only, and {wheelhouse} has no wheel of it")
        else:
            keep.append((r, ver))
    return Plan(p.kept, keep, p.constraints)


def _write_plan(p: Plan, out_dir: Path, extra_constraints: list[str]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "install.txt").write_text("".join(f"{r.install_line()}\n" for r, _ in p.install))
    (out_dir / "constraints.txt").write_text("".join(f"{c}\n" for c in p.constraints + extra_constraints))


def _say_plan(p: Plan) -> None:
    for r, ver in p.kept:
        newer = ver and r.pin and version_key(ver) > version_key(r.pin)
        note = f" (newer than the tested {r.pin})" if newer else ""
        print(f"[setup] kept      {r.name} {ver or '(version not known)'}: in range {r.range_text()}{note}")
    for r, ver in p.install:
        why = "missing" if ver is None else f"{ver} is too old (need {r.range_text()})"
        print(f"[setup] install   {r.install_line()}: {why}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requirements", type=Path, default=REQUIREMENTS)
    sub = ap.add_subparsers(dest="cmd", required=True)
    pp = sub.add_parser("plan", help="what to keep and what to install (TORCH=system, make_wheelhouse.sh)")
    pp.add_argument("--out-dir", type=Path, required=True)
    pp.add_argument("--present", type=Path, help="a pip freeze of the target (default: what this python has)")
    pp.add_argument("--quiet", action="store_true")
    pp.add_argument("--no-dev", action="store_true", help="leave out the `# dev` requirements")
    pp.add_argument("--wheelhouse", type=Path, help="offline: a `# dev` requirement without a wheel here is skipped")
    sub.add_parser("floors", help="every requirement at its floor version")
    pn = sub.add_parser("pins", help="every requirement as a fresh venv installs it")
    pn.add_argument("--no-dev", action="store_true", help="leave out the `# dev` requirements")
    cp = sub.add_parser("cpu-torch", help="the `# cpu-torch` pins to install beside this python's CPU torch")
    cp.add_argument("--floor", action="store_true", help="at their floor versions (.venv-floor)")
    cp.add_argument("--wheelhouse", type=Path, help="offline: one without a wheel here is skipped (said on stderr)")
    rp = sub.add_parser("range", help="the supported range of one requirement")
    rp.add_argument("name")
    ns = ap.parse_args(argv)
    try:
        all_reqs = parse(ns.requirements)
        reqs = [r for r in all_reqs if not r.cpu_torch]  # never beside a CUDA torch: see `cpu-torch`
        if ns.cmd == "cpu-torch":
            for r in cpu_torch_extras(all_reqs, installed_versions(), torch_is_cpu_build()):
                line = f"{r.name}=={r.floor}" if ns.floor and r.floor and r.pin else r.install_line()
                if ns.wheelhouse and not wheel_in(ns.wheelhouse, r):
                    why = f"tests only, and {ns.wheelhouse} has no wheel of it"
                    print(f"[setup] skipped   {line}: {why}", file=sys.stderr)
                else:
                    print(line)
        elif ns.cmd == "floors":
            for r in reqs:
                print(f"{r.name}=={r.floor}" if r.floor and r.pin else r.install_line())
        elif ns.cmd == "pins":
            for r in reqs:
                if not (ns.no_dev and r.dev):
                    print(r.install_line())
        elif ns.cmd == "range":
            match = [r for r in all_reqs if r.key == normalize(ns.name)]
            if not match:
                raise ValueError(f"{ns.requirements}: no requirement {ns.name!r}")
            print(match[0].range_text())
        else:
            present = read_freeze(ns.present) if ns.present else installed_versions()
            p = plan([r for r in reqs if not (ns.no_dev and r.dev)], present)
            if ns.wheelhouse:
                p = drop_dev_not_in(p, ns.wheelhouse)
            # the present packages we do not list pin the rest of the resolution too (make_wheelhouse.sh)
            listed = {r.key for r in reqs}
            # (not torch's CUDA libraries: an image's need not match the PyPI torch's pins, and torch is kept anyway)
            extra = [
                f"{n}=={v}"
                for n, v in sorted(present.items())
                if ns.present and v and n not in listed and not TORCH_FAMILY.match(n)
            ]
            _write_plan(p, ns.out_dir, extra)
            if not ns.quiet:
                _say_plan(p)
    except (ValueError, OSError) as e:
        print(f"reqs.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
