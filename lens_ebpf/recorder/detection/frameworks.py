"""Which training or inference framework a workload runs, from what it shows: pure
functions, evidence in and a verdict out (detection/__init__.py reads and stores).

Evidence, by source (the Detection Status page's): `log` (the progress lines the training
module parsed, by their format), `process` (the containers' command lines and environment
names as the pod declares them, and the programs the node agent saw start in them),
`image` (the containers' images) and `label` (the workload's and its pods' labels). Each
piece names one framework with a confidence; a framework's confidence is that of all its
pieces together (1 - the product of each one's doubt). The verdict is the stack (a
wrapper such as Primus or Lightning over an orchestration framework such as Megatron-LM
or DeepSpeed over PyTorch), or an inference server (vLLM, SGLang), with a status:
verified (the framework's own log lines say it), confirmed (0.7 or more), suspected
(less), conflict (two frameworks that do not stack, both likely), unknown (nothing).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Framework:
    name: str  # the original's ids: megatron, deepspeed, vllm, ...
    title: str  # as people name it
    layer: str  # wrapper, orchestration, runtime, inference
    workload_type: str  # training, inference


FRAMEWORKS = {
    f.name: f
    for f in (
        Framework("primus", "Primus", "wrapper", "training"),
        Framework("lightning", "PyTorch Lightning", "wrapper", "training"),
        Framework("transformers", "Hugging Face Transformers", "wrapper", "training"),
        Framework("megatron", "Megatron-LM", "orchestration", "training"),
        Framework("deepspeed", "DeepSpeed", "orchestration", "training"),
        Framework("torchtitan", "torchtitan", "orchestration", "training"),
        Framework("pytorch", "PyTorch", "runtime", "training"),
        Framework("vllm", "vLLM", "inference", "inference"),
        Framework("sglang", "SGLang", "inference", "inference"),
    )
}
LAYERS = ("wrapper", "orchestration", "inference", "runtime")  # a stack's order, top first
# frameworks of one layer that run together (Megatron-DeepSpeed): not a conflict
STACKS = {
    frozenset({"megatron", "deepspeed"}),
    frozenset({"transformers", "deepspeed"}),
    frozenset({"lightning", "deepspeed"}),
    frozenset({"primus", "megatron"}),
}
SOURCES = ("process", "log", "image", "label")
CONFIRMED = 0.7  # a framework this likely is confirmed; below, suspected
LIKELY = 0.5  # two frameworks this likely that do not stack: a conflict
NOTED = 0.3  # below this a framework is not part of the verdict


@dataclass(frozen=True)
class Evidence:
    """One piece: what it is (key, unique per workload), where it came from, what it
    says and how sure."""

    key: str
    source: str  # process, log, image, label
    framework: str
    confidence: float
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def info(self) -> Framework:
        return FRAMEWORKS[self.framework]


# -- log lines: the training module's formats (training/formats.py) ----------------------
LOG_FORMATS = {
    "megatron": ("megatron", 0.9),
    "deepspeed": ("deepspeed", 0.9),
    "torchtitan": ("torchtitan", 0.9),
    "hf_trainer": ("transformers", 0.85),
}


def from_log_format(fmt: str, lines: int, detail: dict[str, Any]) -> Evidence | None:
    """The progress lines of one format a workload's pods printed (lines of them)."""
    got = LOG_FORMATS.get(fmt)
    if got is None or lines <= 0:
        return None
    name, confidence = got
    return Evidence(
        f"log:{fmt}",
        "log",
        name,
        confidence,
        {
            "format": fmt,
            "lines": lines,
            **detail,
            "matched": f"{FRAMEWORKS[name].title} progress lines",
        },
    )


# -- images ------------------------------------------------------------------------------------
IMAGE_WORDS = (  # a word of the image's repository or tag -> the framework, how sure
    ("megatron", "megatron", 0.6),
    ("primus", "primus", 0.6),
    ("deepspeed", "deepspeed", 0.6),
    ("torchtitan", "torchtitan", 0.6),
    ("vllm", "vllm", 0.7),
    ("sglang", "sglang", 0.7),
    ("lightning", "lightning", 0.5),
    ("transformers", "transformers", 0.5),
    ("huggingface", "transformers", 0.4),
    ("pytorch", "pytorch", 0.4),
    ("torch", "pytorch", 0.3),
)


def words(text: str) -> set[str]:
    return {w for w in re.split(r"[^a-z0-9]+", text.lower()) if w}


def from_image(image: str, container: str) -> list[Evidence]:
    """A container's image, by the words of its name (registry host aside)."""
    ref = image.strip()
    if not ref:
        return []
    name = ref.split("@", 1)[0]
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        name = rest  # the registry's host is no framework's word
    have, out, seen = words(name), [], set()
    for word, fw, confidence in IMAGE_WORDS:
        if fw not in seen and any(w == word or w.startswith(word) for w in have):
            seen.add(fw)
            out.append(
                Evidence(
                    f"image:{fw}:{ref}"[:253],
                    "image",
                    fw,
                    confidence,
                    {"image": ref, "container": container, "matched": word},
                )
            )
    return out


# -- command lines and environment names ----------------------------------------------------
def _argv_rules(argv: list[str]) -> Iterable[tuple[str, float, str]]:
    """(framework, confidence, what matched) of one command line."""
    low = [a.lower() for a in argv]
    text = " ".join(low)
    base = [a.rsplit("/", 1)[-1] for a in low]
    if any(re.match(r"pretrain_\w+\.py$", b) for b in base) or "megatron" in text:
        yield (
            "megatron",
            0.8,
            next(
                (a for a in argv if "megatron" in a.lower() or "pretrain_" in a.lower()),
                "pretrain_*.py",
            ),
        )
    if "deepspeed" in base or any(a.startswith("--deepspeed") for a in low) or "deepspeed" in text:
        yield "deepspeed", 0.8, next((a for a in argv if "deepspeed" in a.lower()), "deepspeed")
    if "torchtitan" in text:
        yield "torchtitan", 0.8, next(a for a in argv if "torchtitan" in a.lower())
    if "vllm" in base or "vllm.entrypoints" in text or re.search(r"\bvllm\b", text):
        yield "vllm", 0.85, next((a for a in argv if "vllm" in a.lower()), "vllm")
    if "sglang" in text:
        yield "sglang", 0.85, next(a for a in argv if "sglang" in a.lower())
    if "primus" in text:
        yield "primus", 0.75, next(a for a in argv if "primus" in a.lower())
    if "lightning" in text:
        yield "lightning", 0.7, next(a for a in argv if "lightning" in a.lower())
    if "accelerate" in base or "transformers" in text:
        yield (
            "transformers",
            0.5,
            next(
                (a for a in argv if "accelerate" in a.lower() or "transformers" in a.lower()),
                "accelerate",
            ),
        )
    if "torchrun" in base or "torch.distributed.run" in text or "torch.distributed.launch" in text:
        yield "pytorch", 0.5, next((a for a in argv if "torch" in a.lower()), "torchrun")


def from_command(argv: list[str], container: str) -> list[Evidence]:
    """A container's command line (its command and args as the pod declares them)."""
    argv = [str(a) for a in argv if str(a).strip()]
    if not argv:
        return []
    line = " ".join(argv)[:1000]
    return [
        Evidence(
            f"process:cmd:{container}:{fw}"[:253],
            "process",
            fw,
            c,
            {"container": container, "command_line": line, "matched": what},
        )
        for fw, c, what in _argv_rules(argv)
    ]


ENV_PREFIXES = (
    ("DEEPSPEED_", "deepspeed", 0.5),
    ("DS_ACCELERATOR", "deepspeed", 0.5),
    ("MEGATRON_", "megatron", 0.5),
    ("VLLM_", "vllm", 0.6),
    ("SGLANG_", "sglang", 0.6),
    ("PL_", "lightning", 0.4),
    ("LIGHTNING_", "lightning", 0.5),
    ("PRIMUS_", "primus", 0.5),
    ("TORCHTITAN_", "torchtitan", 0.5),
    ("TRANSFORMERS_", "transformers", 0.3),
    ("ACCELERATE_", "transformers", 0.3),
)


def from_env(names: Iterable[str], container: str) -> list[Evidence]:
    """The environment variables a container sets (their names: values are not kept)."""
    found: dict[str, list[str]] = {}
    confidence: dict[str, float] = {}
    for name in sorted(set(names)):
        for prefix, fw, c in ENV_PREFIXES:
            if name.upper().startswith(prefix):
                found.setdefault(fw, []).append(name)
                confidence[fw] = max(confidence.get(fw, 0.0), c)
    return [
        Evidence(
            f"process:env:{container}:{fw}"[:253],
            "process",
            fw,
            confidence[fw],
            {"container": container, "environment": names_[:20], "matched": names_[0]},
        )
        for fw, names_ in sorted(found.items())
    ]


def from_exec(comm: str, filename: str) -> list[Evidence]:
    """A program the node agent saw start in one of the workload's containers."""
    out = []
    path = filename or comm
    base = path.rsplit("/", 1)[-1].lower()
    for fw, word, c in (
        ("deepspeed", "deepspeed", 0.7),
        ("vllm", "vllm", 0.75),
        ("sglang", "sglang", 0.75),
        ("pytorch", "torchrun", 0.5),
        ("lightning", "lightning", 0.5),
        ("transformers", "accelerate", 0.4),
    ):
        if base == word or base.startswith(word):
            out.append(
                Evidence(
                    f"process:exec:{fw}:{base}"[:253],
                    "process",
                    fw,
                    c,
                    {"comm": comm, "filename": filename, "matched": base},
                )
            )
    return out


# -- labels ------------------------------------------------------------------------------------
LABEL_WORDS = {
    "megatron": 0.5,
    "deepspeed": 0.5,
    "torchtitan": 0.5,
    "vllm": 0.6,
    "sglang": 0.6,
    "lightning": 0.4,
    "primus": 0.5,
}


def from_labels(labels: dict[str, Any], where: str) -> list[Evidence]:
    """Labels of the workload or its pods that name a framework (framework: deepspeed,
    app.kubernetes.io/name: vllm)."""
    out, seen = [], set()
    for key, value in sorted((labels or {}).items()):
        have = words(f"{key} {value}")
        for word, c in LABEL_WORDS.items():
            if word in have and word not in seen:
                seen.add(word)
                out.append(
                    Evidence(
                        f"label:{where}:{word}"[:253],
                        "label",
                        word,
                        c,
                        {"label": key, "value": str(value), "on": where, "matched": word},
                    )
                )
    return out


# -- the verdict -------------------------------------------------------------------------------
@dataclass
class Verdict:
    status: str = "unknown"  # unknown, suspected, confirmed, verified, conflict
    framework: str = ""
    frameworks: list[str] = field(default_factory=list)  # the stack, top first
    workload_type: str = ""
    confidence: float = 0.0
    framework_layer: str = ""
    wrapper_framework: str = ""
    base_framework: str = ""
    sources: list[str] = field(default_factory=list)
    conflicts: list[dict[str, Any]] = field(default_factory=list)
    scores: dict[str, float] = field(default_factory=dict)  # every framework's


def combined(confidences: Iterable[float]) -> float:
    """Several pieces' confidence together: 1 - the product of their doubts (0.99 at most)."""
    doubt = math.prod(1.0 - min(max(c, 0.0), 1.0) for c in confidences)
    return round(min(1.0 - doubt, 0.99), 4)


def verdict(evidence: list[Evidence]) -> Verdict:
    by_fw: dict[str, list[Evidence]] = {}
    for e in evidence:
        if e.framework in FRAMEWORKS:
            by_fw.setdefault(e.framework, []).append(e)
    scores = {fw: combined(e.confidence for e in got) for fw, got in by_fw.items()}
    kept = {fw: s for fw, s in scores.items() if s >= NOTED}
    if not kept:
        return Verdict(scores=scores)
    layer_of = {fw: FRAMEWORKS[fw].layer for fw in kept}
    stack = sorted(kept, key=lambda fw: (LAYERS.index(layer_of[fw]), -kept[fw], fw))
    conflicts = []
    likely = [fw for fw in stack if kept[fw] >= LIKELY and layer_of[fw] != "runtime"]
    for i, a in enumerate(likely):
        for b in likely[i + 1 :]:
            same_layer = layer_of[a] == layer_of[b]
            kinds = {FRAMEWORKS[a].workload_type, FRAMEWORKS[b].workload_type}
            if (same_layer or len(kinds) > 1) and frozenset({a, b}) not in STACKS:
                conflicts.append(
                    {
                        "frameworks": [a, b],
                        "confidence": [kept[a], kept[b]],
                        "reason": "two inference servers"
                        if kinds == {"inference"}
                        else "training and inference"
                        if len(kinds) > 1
                        else f"two {layer_of[a]} frameworks",
                    }
                )
    top = stack[0]
    base = next((fw for fw in stack if layer_of[fw] in ("orchestration", "inference")), "")
    wrapper = next((fw for fw in stack if layer_of[fw] == "wrapper"), "")
    confidence = max(kept[top], kept.get(base, 0.0))
    used = sorted(
        {e.source for fw in kept for e in by_fw[fw]},
        key=lambda s: SOURCES.index(s) if s in SOURCES else 99,
    )
    lead = base or top
    if conflicts:
        status = "conflict"
    elif any(e.source == "log" for e in by_fw[lead]) and kept[lead] >= CONFIRMED:
        status = "verified"  # the framework's own progress lines
    elif confidence >= CONFIRMED:
        status = "confirmed"
    else:
        status = "suspected"
    return Verdict(
        status=status,
        framework=top,
        frameworks=stack,
        workload_type=FRAMEWORKS[lead].workload_type,
        confidence=confidence,
        framework_layer=layer_of[top],
        wrapper_framework=wrapper,
        base_framework=base,
        sources=used,
        conflicts=conflicts,
        scores=scores,
    )
