"""The repository's Dockerfile read as a file, as Docker would build it (no engine here): its instructions split
into stages at each ``FROM <parent> AS <name>``, and a build target resolved through its chain of parent stages
and the stages it copies from."""
from __future__ import annotations

import functools
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
FROM = re.compile(r"(?:--platform=\S+\s+)?(?P<parent>\S+)(?:\s+AS\s+(?P<name>\S+))?", re.I)


@dataclass(frozen=True)
class Stage:
    name: str
    parent: str  # what FROM names: an image, or an earlier stage
    steps: tuple[tuple[str, str], ...]  # (INSTRUCTION, arguments) after the FROM, in order


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with comment lines dropped and continuation lines joined."""
    text = re.sub(r"\\\n", " ", "\n".join(l for l in text.splitlines() if not l.lstrip().startswith("#")))
    out = []
    for line in text.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


@functools.lru_cache(maxsize=None)
def stages() -> dict[str, Stage]:
    """name -> stage, in file order; a FROM names an image or a stage defined above it."""
    heads: list[tuple[str, str]] = []  # (name, parent) of each FROM
    bodies: list[list[tuple[str, str]]] = []
    for word, args in instructions(DOCKERFILE.read_text(encoding="utf-8")):
        if word == "FROM":
            m = FROM.fullmatch(args)
            assert m, f"FROM {args}"
            heads.append((m["name"] or str(len(heads)), m["parent"]))
            bodies.append([])
        else:
            assert bodies or word == "ARG", f"{word} before the first FROM"
            if bodies:
                bodies[-1].append((word, args))
    names = [name for name, _ in heads]
    assert names and len(set(names)) == len(names), f"{DOCKERFILE}: stages {names}"
    for i, (name, parent) in enumerate(heads):
        assert parent not in names[i:], f"stage {name}: FROM {parent}, a stage not defined above it"
    return {name: Stage(name, parent, tuple(body)) for (name, parent), body in zip(heads, bodies)}


def chain(target: str) -> list[Stage]:
    """The target's stage and its parent stages, the one FROM an image first."""
    defined = stages()
    assert target in defined, f"no stage {target} in {DOCKERFILE.name}"
    out = [defined[target]]
    while out[0].parent in defined:
        out.insert(0, defined[out[0].parent])
    return out


def steps(target: str) -> list[tuple[str, str]]:
    """Every instruction that builds the target's image, in order: ``("FROM", <image>)``, then the steps of each
    stage of its chain."""
    path = chain(target)
    return [("FROM", path[0].parent), *(step for stage in path for step in stage.steps)]


def copy_args(args: str) -> tuple[str | None, list[str]]:
    """(the --from stage or None, the sources) of a COPY's arguments."""
    words = args.split()
    options = dict(w[2:].partition("=")[::2] for w in words if w.startswith("--"))
    return options.get("from"), [w for w in words if not w.startswith("--")][:-1]


def workdir(target: str) -> str:
    """The working directory the target's image ends with (absolute WORKDIRs only)."""
    dirs = [a for w, a in steps(target) if w == "WORKDIR"]
    assert all(d.startswith("/") for d in dirs), f"{target}: a relative WORKDIR"
    return dirs[-1] if dirs else "/"


def copied(args: str) -> list[str]:
    """The paths of the build context one COPY brings in: its sources, or, for ``COPY --from=<stage>``, every path
    that stage's build copies in. Such a COPY must take the stage's whole working directory (a finer one is not
    modelled: extend this before writing one)."""
    stage, sources = copy_args(args)
    if stage is None:
        return sources
    assert stage in stages(), f"COPY --from={stage}: not a stage of {DOCKERFILE.name}"
    assert [s.rstrip("/") for s in sources] == [workdir(stage).rstrip("/")], \
        f"COPY --from={stage} {sources}: not the stage's working directory {workdir(stage)}"
    return copies(stage)


def copies(target: str) -> list[str]:
    """Every path of the build context the target's build copies in, in order, through its parent stages and the
    stages it copies from."""
    return [path for word, args in steps(target) if word == "COPY" for path in copied(args)]


def environment(target: str) -> dict[str, str]:
    """The ENV the target's image ends with (``KEY=VALUE`` forms)."""
    env: dict[str, str] = {}
    for word, args in steps(target):
        if word == "ENV":
            items = shlex.split(args)
            assert all("=" in i for i in items), f"ENV {args}: use KEY=VALUE"
            env.update(i.split("=", 1) for i in items)
    return env


def targets() -> set[str]:
    """The stages nothing else builds on or copies from: the images the file is for."""
    used = {s.parent for s in stages().values()}
    used |= {copy_args(a)[0] for s in stages().values() for w, a in s.steps if w == "COPY"}
    return set(stages()) - used
