"""What each BPF program needs from the kernel, and the ways to get it: one spec per program.

The loader, `lens-ebpf check`, `/readyz` and trace all resolve the same spec against
the running kernel (tracefs formats, kprobe support, kernel functions), so what check
calls supported is what the loader attaches. A need lists its paths in order of
preference; the first whose probe points all exist is chosen and its -D flag set.
A tracepoint field that some kernels lack sets its own flag when present, and the C
side degrades that one detail when it is not (docs/design.md, rule 1 and Kernels).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from lens_ebpf.agent import tracefs
from lens_ebpf.agent.bpf import btf as btf_mod
from lens_ebpf.agent.bpf.btf import Btf

TRACEPOINT, KPROBE = "tracepoint", "kprobe"
# a tracepoint's arguments as the kernel passes them, no record built (checked against
# the kernel's BTF); fields the running kernel's BTF places, read from a tracepoint the
# program has anyway (bpf/btf.py says why that keeps docs/design.md rule 1's promise)
RAW_TRACEPOINT, BTF = "raw_tracepoint", "btf"
# a tracepoint attached BTF-typed (tp_btf): its arguments as raw_tracepoint's (checked the
# same way), held as BTF pointers the program reads with plain loads the verifier checks
# against the kernel's BTF; the loader loads and attaches it itself (tp_btf__<event>)
BTF_TRACEPOINT = "tp_btf"
# a BPF iterator over kernel objects (probes name its target: "tcp" for bpf_iter__tcp),
# run from user space, no probe on any kernel path; its program reads fields the running
# kernel's BTF places, and btf_types names the kernel types it relies on
ITER = "iter"


@dataclass(frozen=True)
class BtfField:
    """A struct member the running kernel's BTF must place: its byte offset becomes
    -D<define>=offset; a path that needs one the kernel lacks (or of another size) is
    passed over."""

    define: str
    member: str  # "struct.member[.member]"
    size: int


@dataclass(frozen=True)
class ProbePath:
    """One way to get a need: tracepoints (classic, or raw with the argument types args),
    kernel functions probed at entry ("fn") or return ("fn:return"), or fields the
    running kernel's BTF places (btf); define is set when this path is chosen."""

    kind: str
    probes: tuple[str, ...]
    define: str = ""
    args: tuple[str, ...] = ()  # RAW_/BTF_TRACEPOINT: each probe's argument types, in C
    btf: tuple[BtfField, ...] = ()
    btf_types: tuple[tuple[str, str], ...] = ()  # (struct, what it shows) BTF must have
    # a cheaper way to what the next path gets as well: passing it over loses nothing, and
    # neither check nor /readyz reports it
    quiet: bool = False

    def functions(self) -> set[str]:
        return {p.split(":", 1)[0] for p in self.probes} if self.kind == KPROBE else set()


@dataclass(frozen=True)
class Need:
    """A capability of a program; optional ones leave the program loadable without them."""

    name: str
    paths: tuple[ProbePath, ...]
    optional: bool = False
    what_is_lost: str = ""


@dataclass(frozen=True)
class Field:
    """A tracepoint field that not every kernel has; define is set when it exists."""

    tracepoint: str
    name: str
    define: str
    what_is_lost: str


@dataclass(frozen=True)
class ProgramSpec:
    name: str
    needs: tuple[Need, ...]
    fields: tuple[Field, ...] = ()

    def need(self, name: str) -> Need:
        return next(n for n in self.needs if n.name == name)

    def all_tracepoints(self) -> list[str]:
        """Every tracepoint any path of this program may use (for check's listing)."""
        out: list[str] = []
        for n in self.needs:
            for p in n.paths:
                if p.kind in (TRACEPOINT, RAW_TRACEPOINT, BTF_TRACEPOINT):
                    out.extend(tp for tp in p.probes if tp not in out)
        return out


@dataclass
class Kernel:
    """What the running kernel offers probes: tracefs, kprobes, functions, its own type
    description (BTF). Swappable."""

    events: Path | None
    kprobes: bool
    functions: frozenset[str] = frozenset()
    btf: Btf | None = None
    # False: take the kernel as one without BPF iterators (tests force the per-message
    # paths with it; a program whose iterator failed to load is loaded again so), and why
    iterators: bool = True
    no_iterators_why: str = "turned off"
    # False: take the kernel as one that cannot attach BTF-typed tracepoints (a program
    # whose tp_btf attachment failed to load is loaded again so), and why
    btf_tracepoints: bool = True
    no_btf_tracepoints_why: str = "turned off"

    @classmethod
    def running(cls, specs: Iterable[ProgramSpec] = ()) -> Kernel:
        events = tracefs.events_dir()
        kprobes = tracefs.kprobes_available()
        wanted: set[str] = set()
        for s in specs:
            for n in s.needs:
                for p in n.paths:
                    wanted |= p.functions()
        funcs = tracefs.kernel_functions(wanted) if kprobes and wanted else set()
        return cls(events, kprobes, frozenset(funcs), btf_mod.running())

    def has_tracepoint(self, tp: str) -> bool:
        return self.events is not None and tracefs.tracepoint_exists(tp, self.events)

    def fields(self, tp: str) -> frozenset[str]:
        return tracefs.tracepoint_fields(tp, self.events) if self.events else frozenset()

    def missing(self, path: ProbePath) -> list[str]:
        """The probe points (and BTF facts) of path this kernel lacks, each with why."""
        if path.kind == KPROBE:
            if not self.kprobes:
                return ["kprobes (kernel built without them)"]
            return sorted(f"{fn}()" for fn in path.functions() - self.functions)
        if path.kind == ITER and not self.iterators:
            return [f"BPF iterators ({self.no_iterators_why})"]
        if path.kind == BTF_TRACEPOINT and not self.btf_tracepoints:
            return [f"BTF-typed tracepoints ({self.no_btf_tracepoints_why})"]
        out = [] if path.kind == ITER else [tp for tp in path.probes if not self.has_tracepoint(tp)]
        if out:
            return out
        if path.kind not in (RAW_TRACEPOINT, BTF_TRACEPOINT, ITER) and not path.btf:
            return out
        if self.btf is None:
            return [f"BTF ({btf_mod.VMLINUX} absent or unreadable)"]
        for struct, what in path.btf_types:
            if self.btf.struct_id(struct) is None:
                out.append(f"{what} (BTF struct {struct})")
        if out:
            return out
        if path.kind in (RAW_TRACEPOINT, BTF_TRACEPOINT):
            for tp in path.probes:
                got = self.btf.raw_tracepoint_args(tp.split(":", 1)[-1])
                if got != path.args:
                    out.append(
                        f"{tp} arguments ({', '.join(got) if got else 'none in BTF'}; "
                        f"expected {', '.join(path.args)})"
                    )
        for f in path.btf:
            got_member = self.btf.member(f.member)
            if got_member is None:
                out.append(f"BTF {f.member}")
            elif got_member[1] != f.size:
                out.append(f"BTF {f.member} of {f.size} bytes (it has {got_member[1]})")
        return out

    def btf_trace_ids(self, path: ProbePath) -> dict[str, int]:
        """tracepoint -> the id of its btf_trace_<event> typedef, for a BTF_TRACEPOINT path
        (present: missing() checked its arguments through it): what the loader loads the
        program against."""
        if path.kind != BTF_TRACEPOINT or self.btf is None:
            return {}
        out = {}
        for tp in path.probes:
            tid = self.btf.trace_typedef(tp.split(":", 1)[-1])
            if tid is not None:
                out[tp] = tid
        return out

    def btf_offsets(self, path: ProbePath) -> dict[str, int]:
        """-D flags for path's BTF fields (present: missing() said so)."""
        out = {}
        for f in path.btf:
            got = self.btf.member(f.member) if self.btf is not None else None
            if got is not None:
                out[f.define] = got[0]
        return out


@dataclass
class Choice:
    """What became of one need: the path taken, or off with why."""

    need: str
    path: ProbePath | None
    reason: str  # why a fallback was taken, or why the need is off

    @property
    def label(self) -> str:
        if self.path is None:
            return "off"
        return self.path.kind


@dataclass
class Plan:
    """A spec resolved on one kernel: what to attach and compile with, and what is lost."""

    spec: ProgramSpec
    choices: dict[str, Choice]
    defines: dict[str, int | str] = field(default_factory=dict)
    missing_fields: list[Field] = field(default_factory=list)  # used, absent, something lost
    # BTF-typed tracepoint -> its btf_trace_<event> type id, read while resolving (the
    # loader needs it and would otherwise parse the kernel's BTF again)
    btf_trace_ids: dict[str, int] = field(default_factory=dict)

    @property
    def degraded(self) -> list[str]:
        """Each missing field, with what is lost."""
        return [f"{f.tracepoint} has no {f.name}: {f.what_is_lost}" for f in self.missing_fields]

    def degraded_for(self, needs: Iterable[str]) -> list[str]:
        """The degradations that touch the tracepoints these needs attach."""
        tps = {tp for n in needs if (p := self.choices[n].path) is not None for tp in p.probes}
        return [
            d
            for f, d in zip(self.missing_fields, self.degraded, strict=True)
            if f.tracepoint in tps
        ]

    @property
    def loadable(self) -> bool:
        return all(self.choices[n.name].path is not None for n in self.spec.needs if not n.optional)

    @property
    def off_reason(self) -> str:
        return "; ".join(
            f"{n.name}: {self.choices[n.name].reason}"
            for n in self.spec.needs
            if not n.optional and self.choices[n.name].path is None
        )

    def uses(self, need: str) -> bool:
        return self.choices[need].path is not None

    def _probes(self, kind: str) -> tuple[str, ...]:
        return tuple(
            p
            for c in self.choices.values()
            if c.path is not None and c.path.kind == kind
            for p in c.path.probes
        )

    def tracepoints(self) -> tuple[str, ...]:
        return self._probes(TRACEPOINT)

    def kprobes(self) -> tuple[str, ...]:
        return self._probes(KPROBE)

    def raw_tracepoints(self) -> tuple[str, ...]:
        return self._probes(RAW_TRACEPOINT)

    def btf_tracepoints(self) -> tuple[str, ...]:
        """The tracepoints attached BTF-typed (the loader attaches tp_btf__<event>)."""
        return self._probes(BTF_TRACEPOINT)

    def iterators(self) -> tuple[str, ...]:
        """The BPF iterator targets the program runs from user space (bpf_iter__<target>)."""
        return self._probes(ITER)

    def paths(self) -> dict[str, str]:
        """need -> "tracepoint", "tp_btf", "raw_tracepoint", "btf", "iter", "kprobe" or "off"
        (for /readyz and check)."""
        return {name: c.label for name, c in self.choices.items()}

    def summary(self) -> str:
        """One line: which needs took a fallback or are off, and which details degrade."""
        parts = []
        for need in self.spec.needs:
            c = self.choices[need.name]
            if not c.reason:
                continue
            lost = f": {need.what_is_lost}" if c.path is None and need.what_is_lost else ""
            parts.append(f"{c.need}: {c.label} ({c.reason}){lost}")
        parts.extend(self.degraded)
        return "; ".join(parts)


def resolve(spec: ProgramSpec, kernel: Kernel, disabled: Iterable[str] = ()) -> Plan:
    """Choose a path per need (the first whose probe points exist) and the field flags."""
    off = set(disabled)
    choices: dict[str, Choice] = {}
    defines: dict[str, int | str] = {}
    trace_ids: dict[str, int] = {}
    for need in spec.needs:
        if need.name in off:
            choices[need.name] = Choice(need.name, None, "disabled by config")
            continue
        passed_over: list[tuple[list[str], str]] = []  # (kinds, what they miss)
        chosen = None
        for path in need.paths:
            missing = kernel.missing(path)
            if not missing:
                chosen = path
                break
            if path.quiet:
                continue
            what = ", ".join(missing)
            if passed_over and passed_over[-1][1] == what:  # said once for both
                passed_over[-1][0].append(path.kind)
            else:
                passed_over.append(([path.kind], what))
        reason = "; ".join(f"no {' or '.join(k)}: {what} missing" for k, what in passed_over)
        choices[need.name] = Choice(need.name, chosen, reason)
        if chosen is not None and chosen.define:
            defines[chosen.define] = 1
        if chosen is not None:
            defines.update(kernel.btf_offsets(chosen))
            trace_ids.update(kernel.btf_trace_ids(chosen))
    missing_fields = []
    for f in spec.fields:
        used = any(c.path is not None and f.tracepoint in c.path.probes for c in choices.values())
        if not used:
            continue
        if f.name in kernel.fields(f.tracepoint):
            defines[f.define] = 1
        elif f.what_is_lost:
            missing_fields.append(f)
    return Plan(spec, choices, defines, missing_fields, trace_ids)


def feature_path(paths: Iterable[str]) -> str:
    """A feature's path from its needs' paths: kprobe where any fell back to one (raw
    tracepoints, BTF fields and iterators count as tracepoint: no kprobe is involved)."""
    used = {p for p in paths if p != "off"}
    return KPROBE if KPROBE in used else TRACEPOINT if used else "off"
