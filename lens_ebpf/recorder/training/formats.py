"""Training progress lines, by the frameworks that print them: one table (FORMATS), each
entry a marker (a substring every such line holds) and a pure parser. A new format is an
entry and its test; the others stay as they are.

Units as stored: seconds per iteration, tokens per second per GPU (what Primus,
torchtitan and Hugging Face's `include_tokens_per_second` print), TFLOP/s per GPU.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
NUM = r"[-+]?(?:\d[\d,]*\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf"


@dataclass
class Progress:
    """What one line says of a run's progress (None: the line does not say)."""

    format: str
    iteration: int | None = None
    target_iterations: int | None = None
    iteration_seconds: float | None = None
    tokens_per_second: float | None = None  # per GPU
    tflops_per_gpu: float | None = None
    loss: float | None = None
    skipped_iterations: int | None = None
    nan_iterations: int | None = None
    samples_per_second: float | None = None
    # the step's time is the gap to the pod's previous line over the steps between them
    # (formats that print no time per step)
    derive_seconds: bool = False


def number(text: str) -> float | None:
    """A printed number (thousands separators allowed); None for nan, inf, or garbage."""
    try:
        v = float(text.replace(",", ""))
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def whole(text: str) -> int | None:
    v = number(text)
    return int(v) if v is not None and v == int(v) else None


# -- Megatron-LM and Primus -----------------------------------------------------------
MEGATRON_ITER = re.compile(r"\biteration\s+(\d+)\s*/\s*(\d+)\s*\|")


def megatron(line: str) -> Progress | None:
    """` iteration  100/ 5000 | consumed samples: ... | elapsed time per iteration (ms):
    1234.5 | throughput per GPU (TFLOP/s/GPU): 345.6 | ... | lm loss: 2.345E+00 | ...`;
    Primus prints `current/average` where Megatron prints one value, and adds
    `tokens per GPU (tokens/s/GPU)`."""
    m = MEGATRON_ITER.search(line)
    if m is None:
        return None
    p = Progress("megatron", iteration=int(m.group(1)), target_iterations=int(m.group(2)))
    for part in line[m.end() :].split("|"):
        key, sep, value = part.partition(":")
        if not sep:
            continue
        key, value = key.strip().lower(), value.strip().split("/")[0].strip()
        if key == "elapsed time per iteration (ms)":
            ms = number(value)
            p.iteration_seconds = round(ms / 1000, 9) if ms is not None else None
        elif key.startswith("throughput per gpu"):
            p.tflops_per_gpu = number(value)
        elif key.startswith("tokens per gpu"):
            p.tokens_per_second = number(value)
        elif key == "number of skipped iterations":
            p.skipped_iterations = whole(value)
        elif key == "number of nan iterations":
            p.nan_iterations = whole(value)
        elif key.endswith("loss") and key != "loss scale" and p.loss is None:
            p.loss = number(value)  # lm loss (GPT), or the model's first loss
    return p


# -- torchtitan -------------------------------------------------------------------------
TITAN = re.compile(rf"\bstep:\s*(\d+)\s+loss:\s*({NUM})")
TITAN_FIELDS = {
    "tps": re.compile(rf"\btps:\s*({NUM})"),
    "tflops": re.compile(rf"\btflops:\s*({NUM})"),
}


def torchtitan(line: str) -> Progress | None:
    """`step: 10  loss: 10.7069  memory: 30.99GiB(32.62%)  tps: 7,034  tflops: 407.35
    mfu: 41.19%` (tps: tokens per second per device)."""
    m = TITAN.search(line)
    if m is None or "tps:" not in line:
        return None
    tps, tflops = (f.search(line) for f in TITAN_FIELDS.values())
    return Progress(
        "torchtitan",
        iteration=int(m.group(1)),
        loss=number(m.group(2)),
        tokens_per_second=number(tps.group(1)) if tps else None,
        tflops_per_gpu=number(tflops.group(1)) if tflops else None,
        derive_seconds=True,
    )


# -- Hugging Face Trainer ---------------------------------------------------------------
HF_PAIR = re.compile(rf"'(\w+)':\s*'?({NUM})'?")


def hf_trainer(line: str) -> Progress | None:
    """The Trainer's logged dict, `{'loss': 2.31, 'grad_norm': ..., 'learning_rate': ...,
    'epoch': 0.5}` (values quoted by newer versions), and its `{'train_runtime': ...}`
    summary (steps per second: the mean iteration time of the run)."""
    start = line.find("{'")
    if start < 0:
        return None
    pairs = {k: v for k, v in HF_PAIR.findall(line[start : start + 4096])}
    if "train_runtime" in pairs:
        sps = number(pairs.get("train_steps_per_second", ""))
        got = {
            k: number(pairs.get(f"train_{k}", ""))
            for k in ("loss", "samples_per_second", "tokens_per_second")
        }
        return Progress(
            "hf_trainer",
            iteration=whole(pairs["step"]) if "step" in pairs else None,
            iteration_seconds=1 / sps if sps else None,
            loss=got["loss"],
            samples_per_second=got["samples_per_second"],
            tokens_per_second=got["tokens_per_second"],
        )
    if "loss" not in pairs or "epoch" not in pairs:
        return None  # an evaluation's dict (eval_loss), or not the Trainer's
    return Progress(
        "hf_trainer",
        iteration=whole(pairs["step"]) if "step" in pairs else None,
        loss=number(pairs["loss"]),
        derive_seconds=True,
    )


# -- DeepSpeed ------------------------------------------------------------------------
DS_STEPS = re.compile(rf"\bsteps:\s*(\d+)\s+loss:\s*({NUM})")
DS_TIME = re.compile(rf"iter time \(s\):\s*({NUM})\s+samples/sec:\s*({NUM})")
DS_SKIPPED = re.compile(r"\bstep=(\d+),\s*skipped=(\d+)")


def deepspeed(line: str) -> Progress | None:
    """The engine's `steps: 100 loss: 0.0585 iter time (s): 0.186 samples/sec: 53.694`
    (losses of its own between them, as Megatron-DeepSpeed's MoE prints) and its
    `[Rank 0] step=30, skipped=20, lr=[...]` (skipped steps so far)."""
    if m := DS_STEPS.search(line):
        t = DS_TIME.search(line, m.end())
        return Progress(
            "deepspeed",
            iteration=int(m.group(1)),
            loss=number(m.group(2)),
            iteration_seconds=number(t.group(1)) if t else None,
            samples_per_second=number(t.group(2)) if t else None,
        )
    if m := DS_SKIPPED.search(line):
        return Progress("deepspeed", iteration=int(m.group(1)), skipped_iterations=int(m.group(2)))
    return None


@dataclass(frozen=True)
class Format:
    name: str
    markers: tuple[str, ...]  # a line holds one of them, or the parser is not asked
    parse: Callable[[str], Progress | None]


FORMATS: tuple[Format, ...] = (
    Format("megatron", ("elapsed time per iteration",), megatron),
    Format("torchtitan", ("tps:",), torchtitan),
    Format("deepspeed", ("samples/sec:", "skipped="), deepspeed),
    Format("hf_trainer", ("'loss'", "'train_runtime'"), hf_trainer),
)
MAX_LINE = 65536  # longer lines are not progress lines


def parse(line: str) -> Progress | None:
    """The progress a log line reports (ANSI colors removed first); None for any other
    line."""
    if len(line) > MAX_LINE:
        return None
    if "\x1b" in line:
        line = ANSI.sub("", line)
    for fmt in FORMATS:
        if any(m in line for m in fmt.markers):
            got = fmt.parse(line)
            if got is not None:
                return got
    return None
